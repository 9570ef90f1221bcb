"""Helpers the tests import: fakes, builders, clients and shared data (fixtures stay in
the ``conftest.py`` files)."""
