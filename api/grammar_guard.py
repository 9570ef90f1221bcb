"""The grammar engine's validation of a request's grammar, in a process of its own.

llguidance (1.9) kills the process that compiles some grammars: a JSON ``const`` integer
that rounds to -2^63 (also inside a Lark ``%json`` block), a chain of some thousands of
Lark rules or JSON-schema ``$ref`` s (its recursion overflows the stack). Compiled in the
gateway, one such request took the gateway down, and a few in a minute the whole server.
So ``validate`` runs ``LLMatcher.validate_grammar_with_warnings`` in one child process
(started on first use, kept for the next): a grammar that kills the child is refused,
the child is started again, and the gateway serves on. A grammar that passes here is
compiled by the runner with the same engine (``houchu.model.grammar``).
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

#: Seconds one validation may take (llguidance's own limits end a slow compile first).
VALIDATE_TIMEOUT_S = 60.0


class EngineCrashed(Exception):
    """The grammar engine killed its process on this grammar (its exit is the message)."""


def _validate(grammar: str) -> tuple[bool, list[str]]:
    from llguidance import LLMatcher

    return LLMatcher.validate_grammar_with_warnings(grammar)


class _Guard:
    """One child process that validates grammars, started again after a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def validate(self, grammar: str) -> tuple[bool, list[str]]:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")  # no forked event loop or threads
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
            pool = self._pool
        try:
            return pool.submit(_validate, grammar).result(timeout=VALIDATE_TIMEOUT_S)
        except BrokenProcessPool as e:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise EngineCrashed("the grammar engine (llguidance) crashed on it") from e


_GUARD = _Guard()


def validate(grammar: str) -> tuple[bool, list[str]]:
    """llguidance's ``(is_error, messages)`` for ``grammar`` (its text, as
    ``llguidance.grammar_from`` writes it), computed in the guard's child process.

    Raises:
        EngineCrashed: the engine killed the child compiling ``grammar``.
        TimeoutError: no answer within ``VALIDATE_TIMEOUT_S`` seconds.
    """
    return _GUARD.validate(grammar)
