"""A request's parsing, off the gateway's event loop.

Parsing a request can wait: a grammar (``response_format``, ``guided_*``, ``tools``) is
checked by the grammar engine in a child process, one at a time (``grammar_guard``), and
a check takes from a millisecond to ``VALIDATE_TIMEOUT_S`` seconds. Parsed on the event
loop, four hostile grammars held ``/health`` and every other request for 7.8 s. So the
HTTP and WebSocket handlers parse on a thread of their own pool (threads only wait
there: the engine runs in the child), and the loop serves on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: Requests parsed at once; more wait for a thread. Threads mostly wait on the grammar
#: check's child, so many are cheap; a request without a grammar takes well under 1 ms.
PARSE_THREADS = 64

_POOL = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="parse")


async def off_loop(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` on a parsing thread, awaited; its exception is raised here."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
