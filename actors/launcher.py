"""The launcher: starts every actor in its own process, keeps them running, and shuts
them all down cleanly.

Start order does not matter (ZeroMQ connects lazily); the launcher binds its own inbox
first, then starts the recorder, runner, scheduler, tokenizer and gateway as plain
subprocesses (``python -m houchu.actors.runtime NAME``, the configuration as JSON on
stdin) and waits for an ``ActorReady`` from each; a failure at start-up stops everything
with the actor's error. Once serving, the ``Supervisor`` restarts an actor that dies or
stops answering (``houchu.actors.supervisor`` explains how the others recover). On
Ctrl-C or SIGTERM — or when an actor's restart budget is spent — it stops every actor
process, removes the run directory with its socket files and the shared host KV pool.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import time

import zmq.asyncio

from houchu.actors.kv_tier_setup import prepare_kv_tiers
from houchu.actors.placement import PlacementError, check_port_free, place_actors
from houchu.actors.run_dirs import make_run_dir, sweep_stale
from houchu.actors.supervisor import Supervisor, SupervisorStop
from houchu.options.serve_config import ServeConfig
from houchu.transport.channel import BadMessage, Inbox
from houchu.transport.messages import ActorFailed, ActorReady, LauncherInbox
from houchu.transport.peers import dropped, receive
from houchu.transport.security import InsecureTransport

#: Start order; shutdown goes in reverse (the recorder last, to take the final flushes).
ACTOR_ORDER = ("recorder", "runner", "scheduler", "tokenizer", "gateway")
#: Seconds between the supervisor's checks of the actor processes.
TICK_S = 0.2


def active_actors(config: ServeConfig) -> tuple[str, ...]:
    """The actors this configuration runs, in start order (optional ones after the
    recorder, so they are stopped after the core actors; the draft actor only when
    speculative decoding proposes outside the runner: not for "mtp")."""
    optional = ("kv_tiers",) if config.kv_tiers.enabled else ()
    draft = ("draft",) if config.speculation.uses_draft_actor else ()
    recorder = ACTOR_ORDER[:1] if config.telemetry.enabled else ()
    return (*recorder, *optional, *draft, *ACTOR_ORDER[1:])


class LaunchError(RuntimeError):
    """An actor failed to start, or did not report ready in time."""


class Launcher:
    """Owns the actor processes of one ``houchu serve``.

    Args:
        config: the serving configuration; the launcher fills in its ``launch`` part:
            the host KV pool here, and at ``serve`` the endpoints (ipc:// sockets in a
            fresh run directory, mode 0700, or CURVE-secured tcp:// ports:
            ``houchu.actors.placement``).
    """

    def __init__(self, config: ServeConfig) -> None:
        sweep_stale()  # the run directories of launchers that were killed outright
        self.run_dir = make_run_dir()
        self.config = config
        self.host_pool = None
        if self.config.kv_tiers.enabled:
            self.config, self.host_pool = prepare_kv_tiers(self.config)
        self.actors = active_actors(self.config)
        self._stop = asyncio.Event()

    async def serve(self) -> int:
        """Start everything, serve until a signal or an unrecoverable actor failure;
        return an exit code (0 after a requested shutdown)."""
        try:
            check_port_free(self.config.gateway.host, self.config.gateway.port)
            self.config = place_actors(self.config, self.run_dir)
        except (PlacementError, InsecureTransport) as e:
            print(f"houchu: {e}", file=sys.stderr, flush=True)
            self._clean_up()
            return 1
        ctx = zmq.asyncio.Context()
        inbox: Inbox[LauncherInbox] = Inbox(ctx, self.config.endpoints["launcher"], LauncherInbox)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        code = 0
        c, p = self.config, self.config.placement
        where = self.run_dir if p.actor_transport == "ipc" else f"tcp://{p.actor_host}"
        print(f"houchu: actor sockets in {where}", flush=True)
        sup = Supervisor(ctx, self.config, self.actors)
        try:
            sup.spawn_all()
            await self._wait_ready(inbox, sup)
            url = f"http://{c.gateway.host}:{c.gateway.port}"
            print(f"houchu: serving {c.model_name()} at {url}", flush=True)
            print("houchu: press Ctrl-C to stop", flush=True)
            code = await self._supervise(inbox, sup)
        except LaunchError as e:
            print(f"houchu: {e}", file=sys.stderr, flush=True)
            code = 1
        finally:
            await sup.shutdown()
            inbox.close()
            ctx.destroy(linger=0)
            self._clean_up()
        return code

    def _clean_up(self) -> None:
        """Remove the run directory (socket files) and the shared host KV pool."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.host_pool is not None:
            self.host_pool.close()

    async def _wait_ready(self, inbox: Inbox[LauncherInbox], sup: Supervisor) -> None:
        pending = set(self.actors)
        ready_timeout_s = self.config.timings.ready_timeout_s
        deadline = time.monotonic() + ready_timeout_s
        while pending:
            if self._stop.is_set():
                raise LaunchError("interrupted while starting")
            dead = [ap.name for ap in sup.exited()]
            if dead:
                raise LaunchError(f"actor {dead[0]} exited while starting (see its error above)")
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"actors not ready after {ready_timeout_s:.0f} s: {', '.join(sorted(pending))}"
                )
            msg = await receive(inbox, "", TICK_S, sys.stderr)
            if msg is None:
                continue
            match msg:
                case ActorReady(name=name, info=info, pid=pid) if name in pending:
                    pending.discard(name)
                    ap = sup.procs[name]
                    ap.ready, ap.last_beat = True, time.monotonic()
                    print(f"houchu: {name} ready (pid {pid}) {info}", flush=True)
                case ActorFailed(name=name, error=error):
                    raise LaunchError(f"actor {name} failed to start: {error}")
                case _:
                    await sup.handle(msg)

    async def _supervise(self, inbox: Inbox[LauncherInbox], sup: Supervisor) -> int:
        next_tick = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_tick:
                try:
                    await sup.tick()
                except SupervisorStop as e:
                    print(f"houchu: {e}", file=sys.stderr, flush=True)
                    return 1
                next_tick = time.monotonic() + TICK_S
            if not await inbox.poll(TICK_S):
                continue
            while True:  # everything queued, then check the processes again
                try:
                    msg = inbox.recv_nowait()
                except BadMessage as e:
                    dropped("", e, sys.stderr)
                    continue
                if msg is None:
                    break
                await sup.handle(msg)
        print("houchu: shutting down", flush=True)
        return 0
