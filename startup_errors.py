"""Expected reasons an actor stops while starting, reported without a traceback.

A traceback is for bugs. A port that another program holds, or a shutdown that arrives
before the actor was ready, is neither: the actor process prints one line (or nothing)
and the launcher's own message says the rest.
"""

from __future__ import annotations


class StartupFailure(Exception):
    """An actor cannot start, for a reason its message says whole (e.g. "cannot listen
    on 127.0.0.1:8000: address already in use"); printed as one line, no traceback."""


class ShutdownBeforeReady(Exception):
    """The launcher asked the actor to stop before it was ready (another actor failed to
    start): the actor exits quietly."""
