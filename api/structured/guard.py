"""The grammar engine's validation of a request's grammar, in a process of its own.

llguidance (1.9) kills the process that compiles some grammars: a JSON ``const`` integer
that rounds to -2^63 (also inside a Lark ``%json`` block), a chain of some thousands of
Lark rules or JSON-schema ``$ref`` s (its recursion overflows the stack). Compiled in the
gateway, one such request took the gateway down, and a few in a minute the whole server.
So ``validate`` runs ``LLMatcher.validate_grammar_with_warnings`` (and builds a matcher)
in one child process (started on first use, kept for the next), on a thread with half
the runner's stack: a grammar that kills the child is refused, the child is started
again, and the gateway serves on. A grammar that passes here is compiled by the runner
with the same engine (``houchu.model.grammar.matcher``), with twice the stack.

One grammar is checked at a time (a crash fails every grammar queued in the child's
pool, so none is queued there), and the last ``VERDICTS_KEPT`` verdicts are kept, so a
grammar sent again (a client retrying a refused request) is answered without the child.
The callers wait on a thread of their own (``houchu.api.requests.parse_thread``): the gateway's
event loop serves every other request meanwhile.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

#: Seconds one validation may take (llguidance's own limits end a slow compile first).
VALIDATE_TIMEOUT_S = 60.0
#: Verdicts kept, by the grammar's hash: the newest first out of the cache last.
VERDICTS_KEPT = 512


class EngineCrashed(Exception):
    """The grammar engine killed its process on this grammar (its exit is the message)."""


#: The stack of the child's compiling thread: half of the 8 MiB the runner's threads get,
#: so a grammar whose compile recursion fits here fits the runner's matcher with room to
#: spare (a 2,675-rule chain passed a check on an 8 MiB stack and overflowed the runner's).
CHECK_STACK_BYTES = 4 << 20


def _validate(grammar: str) -> tuple[bool, list[str]]:
    """In the child: llguidance's validation, then a matcher of the grammar over a byte
    tokenizer (what the runner builds over the model's), on a thread of
    ``CHECK_STACK_BYTES``."""
    result: list[tuple[bool, list[str]]] = []

    def run() -> None:
        from llguidance import LLMatcher, LLTokenizer

        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        if not is_error:
            LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
        result.append((is_error, messages))

    threading.stack_size(CHECK_STACK_BYTES)
    thread = threading.Thread(target=run, name="grammar-check")
    thread.start()
    thread.join()
    if not result:
        raise RuntimeError("the grammar check's thread ended without an answer")
    return result[0]


class _Guard:
    """One child process that validates grammars one at a time, started again after a
    crash, and the verdicts of the last ``VERDICTS_KEPT`` grammars."""

    def __init__(self, check: Callable[[str], tuple[bool, list[str]]] = _validate) -> None:
        self._run = check  # what the child runs (a module-level function: pickled by name)
        self._lock = threading.Lock()  # one check at a time
        self._pool: ProcessPoolExecutor | None = None
        self._verdicts: OrderedDict[bytes, tuple[bool, list[str]] | str] = OrderedDict()

    def validate(self, grammar: str) -> tuple[bool, list[str]]:
        key = hashlib.blake2b(grammar.encode(), digest_size=16).digest()
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is None:
                verdict = self._check(grammar)
                self._verdicts[key] = verdict
                while len(self._verdicts) > VERDICTS_KEPT:
                    self._verdicts.popitem(last=False)
            self._verdicts.move_to_end(key)
        if isinstance(verdict, str):
            raise EngineCrashed(verdict)
        return verdict

    def _check(self, grammar: str) -> tuple[bool, list[str]] | str:
        """The child's verdict, or the crash's message (under the lock)."""
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no forked event loop or threads
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        pool = self._pool
        try:
            return pool.submit(self._run, grammar).result(timeout=VALIDATE_TIMEOUT_S)
        except BrokenProcessPool:
            self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            return "the grammar engine (llguidance) crashed on it"
        except TimeoutError:
            self._pool = None  # the child is still compiling it: the next check gets a
            _kill_workers(pool)  # fresh one, not a wait behind this grammar
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Ends ``pool``'s child processes (one stuck compiling a grammar). Before
    ``shutdown``, which forgets them; ``ProcessPoolExecutor.terminate_workers`` does
    this from Python 3.14."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()


_GUARD = _Guard()


def validate(grammar: str) -> tuple[bool, list[str]]:
    """llguidance's ``(is_error, messages)`` for ``grammar`` (its text, as
    ``llguidance.grammar_from`` writes it), computed in the guard's child process.

    Blocks (on a lock and the child) for up to ``VALIDATE_TIMEOUT_S`` seconds behind
    every check queued before it: call it off the event loop.

    Raises:
        EngineCrashed: the engine killed the child compiling ``grammar`` (now or when
            the same grammar was checked before).
        TimeoutError: no answer within ``VALIDATE_TIMEOUT_S`` seconds.
    """
    return _GUARD.validate(grammar)
