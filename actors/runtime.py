"""What every actor process shares: start-up, the ready report, the heartbeat, the parent
watchdog.

An actor is a class with ``async start()`` (load what it needs, then report ready),
``async run()`` (its receive loop; returns on ``Shutdown``) and ``async close()`` (called
here in a ``finally``, whatever happened); every actor but the gateway (whose loop is its
engine client's) gets ``run`` and ``close`` from ``houchu.transport.actor_base.ActorBase``.
It may have ``busy_s()``, the seconds its current blocking unit of work has run (reported
with each heartbeat).

Each actor process is started by the launcher as ``python -m houchu.actors.runtime NAME``
with the serving configuration as JSON on stdin (``main``); no pickle is involved. After
reporting ready it sends a ``Heartbeat`` from its event loop every
``heartbeat_interval_s`` seconds, and it exits when the launcher is gone (no orphans).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import traceback
from typing import Protocol

import zmq.asyncio

from houchu.options.serve_config import ServeConfig
from houchu.startup_errors import ShutdownBeforeReady, StartupFailure
from houchu.transport.channel import Outbox
from houchu.transport.messages import ActorFailed, ActorReady, Heartbeat


class Actor(Protocol):
    name: str

    async def start(self) -> str:
        """Load and bind; return a one-line summary for the ready report."""
        ...

    async def run(self) -> None:
        """Serve until shut down."""
        ...

    async def close(self) -> None: ...


def _make_actor(name: str, ctx: zmq.asyncio.Context, config: ServeConfig) -> Actor:
    # Imported here so that each process loads only what its actor needs (no torch in
    # the gateway or tokenizer processes).
    if name == "gateway":
        from houchu.actors.gateway import GatewayActor

        return GatewayActor(ctx, config)
    if name == "tokenizer":
        from houchu.actors.tokenizer import TokenizerActor

        return TokenizerActor(ctx, config)
    if name == "scheduler":
        from houchu.actors.scheduler import SchedulerActor

        return SchedulerActor(ctx, config)
    if name == "runner":
        from houchu.actors.runner import RunnerActor

        return RunnerActor(ctx, config)
    if name == "recorder":
        from houchu.actors.recorder import RecorderActor

        return RecorderActor(ctx, config)
    if name == "kv_tiers":
        from houchu.actors.kv_tiers import KVTierActor

        return KVTierActor(ctx, config)
    if name == "draft":
        from houchu.actors.draft import DraftActor

        return DraftActor(ctx, config)
    raise ValueError(f"unknown actor {name!r}")


def install_uvloop() -> None:
    """Use uvloop's event loop where it is installed."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> None:
    """``python -m houchu.actors.runtime NAME``: read the JSON configuration from stdin
    and run actor NAME until it is shut down (exit status 1 if it fails)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m houchu.actors.runtime")
    p.add_argument("name", help="the actor to run (gateway, tokenizer, scheduler, ...)")
    args = p.parse_args(argv)
    config_json = sys.stdin.buffer.read()
    sys.stdin.close()
    actor_process_main(args.name, config_json)


def actor_process_main(name: str, config_json: bytes) -> None:
    """Process entry point: run actor ``name`` until shut down; exit 1 if it fails."""
    parent = os.getppid()  # now, before a long start-up: the launcher may die meanwhile
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    install_uvloop()
    config = ServeConfig.from_json(config_json)
    code = asyncio.run(_run(name, config, parent))
    sys.exit(code)


def _die_with_parent() -> None:
    """On Linux, have the kernel send SIGTERM to this process when the launcher dies
    (``prctl(PR_SET_PDEATHSIG)``); elsewhere the parent watchdog alone does it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


async def _run(name: str, config: ServeConfig, parent: int) -> int:
    ctx = zmq.asyncio.Context()
    launcher = Outbox(ctx, config.endpoints["launcher"])
    actor: Actor | None = None
    code = 0
    try:
        actor = _make_actor(name, ctx, config)
        info = await actor.start()
        await launcher.send(ActorReady(name=name, pid=os.getpid(), info=info))
        run = asyncio.create_task(actor.run())
        watch = asyncio.create_task(_watch_parent(parent))
        interval_s = config.timings.heartbeat_interval_s
        beat = asyncio.create_task(_heartbeat(launcher, name, actor, interval_s))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, run.cancel)
        done, _ = await asyncio.wait({run, watch, beat}, return_when=asyncio.FIRST_COMPLETED)
        for t in (run, watch, beat):
            t.cancel()
        if run in done and not run.cancelled() and run.exception() is not None:
            raise run.exception()  # type: ignore[misc]
    except ShutdownBeforeReady:
        code = 0  # another actor failed to start; the launcher says which
    except Exception as e:
        code = 1
        expected = isinstance(e, StartupFailure)
        detail = f"{e}\n" if expected else "".join(traceback.format_exception(e))
        print(f"houchu {name}: {detail}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            await launcher.send(ActorFailed(name=name, error=f"{type(e).__name__}: {e}"))
            await asyncio.sleep(0.2)  # let the report leave before the context closes
    finally:
        if actor is not None:
            with contextlib.suppress(Exception):
                await actor.close()
        launcher.close()
        ctx.destroy(linger=0)
    return code


async def _heartbeat(launcher: Outbox, name: str, actor: Actor, interval_s: float) -> None:
    """Tell the launcher every ``interval_s`` seconds that this event loop is alive."""
    pid = os.getpid()
    busy = getattr(actor, "busy_s", None)
    while True:
        await launcher.send(Heartbeat(name=name, pid=pid, busy_s=busy() if busy else 0.0))
        await asyncio.sleep(interval_s)


async def _watch_parent(ppid: int) -> None:
    """Return when the launcher is gone (this process was re-parented): no orphans."""
    while os.getppid() == ppid:
        await asyncio.sleep(1.0)


if __name__ == "__main__":
    main()
