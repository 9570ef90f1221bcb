"""Alembic migrations of houchu's database schema (run by ``houchu.storage.db.migrate``)."""
