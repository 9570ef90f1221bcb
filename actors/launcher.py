"""The launcher: starts every actor in its own process, waits until all are ready, and
shuts them all down cleanly.

Start order does not matter (ZeroMQ connects lazily); the launcher binds its own inbox
first, then spawns the recorder, runner, scheduler, tokenizer and gateway, and waits for an
``ActorReady`` from each. On Ctrl-C or SIGTERM — or when any actor dies — it terminates
every actor process and removes the run directory with its socket files.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.actors.kv_tier_setup import prepare_kv_tiers
from houchu.actors.runtime import actor_process_main
from houchu.transport.channel import Inbox, Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import ActorFailed, ActorReady, LauncherInbox, Shutdown

#: Spawn order; shutdown goes in reverse (the recorder last, to take the final flushes).
ACTOR_ORDER = ("recorder", "runner", "scheduler", "tokenizer", "gateway")


#: Actors whose death does not stop the server.
OPTIONAL_ACTORS = ("kv_tiers",)


def active_actors(config: ServeConfig) -> tuple[str, ...]:
    """The actors this configuration runs, in spawn order (optional ones after the
    recorder, so they are stopped after the core actors; the draft actor only when
    speculative decoding is on)."""
    optional = ("kv_tiers",) if config.kv_tiers else ()
    draft = ("draft",) if config.speculative else ()
    recorder = ACTOR_ORDER[:1] if config.telemetry else ()
    return (*recorder, *optional, *draft, *ACTOR_ORDER[1:])


class LaunchError(RuntimeError):
    """An actor failed to start, or did not report ready in time."""


class Launcher:
    """Owns the actor processes of one ``houchu serve``.

    Args:
        config: the serving configuration (its endpoints are replaced by ipc:// sockets in
            a fresh run directory).
    """

    def __init__(self, config: ServeConfig) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="houchu-"))
        import msgspec

        self.config = msgspec.structs.replace(config, endpoints=Endpoints.ipc(self.run_dir))
        self.procs: dict[str, mp.process.BaseProcess] = {}
        self.host_pool = None
        if self.config.kv_tiers:
            self.config, self.host_pool = prepare_kv_tiers(self.config)
        self.actors = active_actors(self.config)
        self._stop = asyncio.Event()

    async def serve(self) -> int:
        """Start everything, serve until a signal or an actor dies; return an exit code."""
        ctx = zmq.asyncio.Context()
        inbox: Inbox[LauncherInbox] = Inbox(ctx, self.config.endpoints["launcher"], LauncherInbox)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        code = 0
        print(f"houchu: actor sockets in {self.run_dir}", flush=True)
        try:
            self._spawn_all()
            await self._wait_ready(inbox)
            c = self.config
            print(f"houchu: serving {c.model_name()} at http://{c.host}:{c.port}", flush=True)
            print("houchu: press Ctrl-C to stop", flush=True)
            code = await self._supervise()
        except LaunchError as e:
            print(f"houchu: {e}", file=sys.stderr, flush=True)
            code = 1
        finally:
            await self._shutdown(ctx)
            inbox.close()
            ctx.destroy(linger=0)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if self.host_pool is not None:
                self.host_pool.close()
        return code

    def _spawn_all(self) -> None:
        spawn = mp.get_context("spawn")
        payload = self.config.to_json()
        for name in self.actors:
            p = spawn.Process(
                target=actor_process_main, args=(name, payload), name=f"houchu-{name}"
            )
            p.start()
            self.procs[name] = p

    async def _wait_ready(self, inbox: Inbox[LauncherInbox]) -> None:
        pending = set(self.actors)
        deadline = time.monotonic() + self.config.ready_timeout_s
        while pending:
            if self._stop.is_set():
                raise LaunchError("interrupted while starting")
            dead = [n for n in pending if not self.procs[n].is_alive()]
            if dead:
                raise LaunchError(f"actor {dead[0]} exited while starting (see its error above)")
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"actors not ready after {self.config.ready_timeout_s:.0f} s: "
                    f"{', '.join(sorted(pending))}"
                )
            if not await inbox.poll(0.2):
                continue
            match await inbox.recv():
                case ActorReady(name=name, info=info):
                    pending.discard(name)
                    print(f"houchu: {name} ready (pid {self.procs[name].pid}) {info}", flush=True)
                case ActorFailed(name=name, error=error):
                    raise LaunchError(f"actor {name} failed to start: {error}")

    async def _supervise(self) -> int:
        while not self._stop.is_set():
            for name, p in list(self.procs.items()):
                if not p.is_alive() and name in OPTIONAL_ACTORS:
                    # The tiers only hold copies: serving goes on without them (the
                    # scheduler's lookups time out and it recomputes).
                    print(f"houchu: actor {name} died (exit code {p.exitcode}); serving "
                          "on without it", file=sys.stderr, flush=True)  # fmt: skip
                    del self.procs[name]
                    continue
                if not p.is_alive():
                    print(
                        f"houchu: actor {name} died (exit code {p.exitcode}); stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
            try:
                await asyncio.wait_for(self._stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        print("houchu: shutting down", flush=True)
        return 0

    async def _shutdown(self, ctx: zmq.asyncio.Context, grace_s: float = 5.0) -> None:
        """Ask every live actor to stop, then terminate and finally kill stragglers."""
        outs = []
        for name in reversed(self.actors):  # gateway first: stop taking requests
            p = self.procs.get(name)
            if p is not None and p.is_alive():
                out = Outbox(ctx, self.config.endpoints[name])
                outs.append(out)
                await out.send(Shutdown("launcher"))
        deadline = time.monotonic() + grace_s
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        for p in self.procs.values():
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for out in outs:
            out.close()
