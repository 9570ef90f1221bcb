"""Supervision of the actor processes: restart what dies, kill and restart what hangs.

The shape
---------
Every actor runs in its own plain subprocess, ``python -m houchu.actors.runtime NAME``,
with the JSON configuration on its stdin (no pickle: nothing but JSON and msgpack crosses
a process boundary). Its inbox address never changes, so a replacement binds the same
socket as the process it replaces. The launcher's ``Supervisor`` watches each process:

- **Death.** A process that exits (crash, kill, out of memory) is restarted after a
  backoff (0 s, then 1, 2, 4, ... up to 10 s), at most ``--max-restarts`` times within
  ``--restart-window`` seconds; one more death stops the server with a message naming the
  actor. The recorder, the KV-tier manager and the draft are optional: when their budget
  runs out the server serves on without them (no telemetry, no lower KV tiers, no
  speculation).
- **Hang.** Each actor's event loop sends a ``Heartbeat`` about once a second, with the
  seconds its current blocking unit of work has run (``busy_s``: the runner's model
  step, which runs on a worker thread so that the loop stays responsive). An actor whose
  last heartbeat is older than ``--heartbeat-timeout`` seconds, or whose one step has run
  longer, is killed (SIGKILL, which also ends a SIGSTOP'd process) and then handled as a death.
  A peer that waited too long on an actor (the scheduler on a step result) may report it
  with ``ActorStuck``; the launcher kills that actor the same way.
- **Announcements.** Right after a death the launcher sends ``ActorDown(name,
  generation)`` to every other live actor, and ``ActorUp`` once the replacement reported
  ready. On ``ActorDown`` a receiver first handles everything already queued in its inbox
  (the dead process's last messages, so none is applied after its state was dropped),
  then reconnects its outboxes to the dead actor (``Peers.reconnect``: what was queued
  for the dead process is dropped, so it never reaches the replacement), then drops what
  it held for it:

  ========== ==================================================================
  died       who reacts, and how
  ========== ==================================================================
  gateway    tokenizer aborts every request (the scheduler frees their pages);
             client connections are lost; the replacement binds the same port;
             runner sends it ``RunnerInfo`` (the limits) again
  tokenizer  gateway fails its in-flight requests (503); scheduler aborts all;
             runner sends it ``RunnerInfo`` again
  scheduler  tokenizer fails its requests (503); runner drops per-request state
             and sends ``RunnerInfo`` again; KV-tier manager takes back granted
             and pinned host slots; draft drops its sequences
  runner     scheduler fails every request (503), rebuilds its page pool and
             radix tree (the device KV is gone) and plans again on the new
             runner's ``RunnerInfo`` (which the tokenizer and gateway get too);
             the lower KV tiers keep their copies
  kv_tiers   scheduler forgets host-slot grants and pending lookups (misses);
             the host pool (shared memory, owned by the launcher) survives, the
             SSD tier is found again by re-scanning its directory
  draft      scheduler steps without proposals until ``ActorUp(draft)``
  recorder   telemetry sent meanwhile is lost; everyone reconnects
  ========== ==================================================================

  Requests a dead actor was handling therefore end with one clean error (HTTP 503
  before any output; ``finish_reason: "error"`` and a message on a stream), never a
  hang, and requests that arrive while it restarts wait for the replacement.

This module holds the pieces that need no model: the restart budget, one actor's
process, and the supervisor's state machine; ``houchu.actors.launcher`` drives it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq.asyncio

from houchu.options.serve_config import ServeConfig
from houchu.transport.channel import Outbox
from houchu.transport.messages import (
    ActorDown,
    ActorFailed,
    ActorReady,
    ActorStuck,
    ActorUp,
    Heartbeat,
    LauncherInbox,
    Shutdown,
)

#: Actors whose death does not stop the server once their restart budget is spent.
OPTIONAL_ACTORS = ("recorder", "kv_tiers", "draft")
#: Longest wait before a restart, seconds.
MAX_BACKOFF_S = 10.0
#: A gap between the supervisor's own ticks longer than this (seconds; at most half the
#: heartbeat timeout) is its own pause, not the actors' silence (``_forgive_own_pause``).
PAUSE_GAP_S = 5.0


class RestartBudget:
    """At most ``max_restarts`` restarts within any ``window_s`` seconds.

    Args:
        max_restarts: restarts allowed per window (0: none).
        window_s: the sliding window, seconds.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_restarts < 0 or window_s <= 0:
            raise ValueError(
                f"need max_restarts >= 0 and window_s > 0, got {max_restarts}, {window_s}"
            )
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._deaths: deque[float] = deque()

    def _prune(self, now: float) -> None:
        while self._deaths and now - self._deaths[0] > self.window_s:
            self._deaths.popleft()

    def on_death(self) -> bool:
        """Count a death; True if a restart is still allowed."""
        now = self._clock()
        self._prune(now)
        self._deaths.append(now)
        return len(self._deaths) <= self.max_restarts

    @property
    def recent(self) -> int:
        """Deaths within the window, the latest included."""
        self._prune(self._clock())
        return len(self._deaths)

    def backoff_s(self) -> float:
        """Seconds to wait before the next restart: 0 for the first death in the window,
        then 1, 2, 4, ... up to ``MAX_BACKOFF_S``."""
        n = self.recent
        return 0.0 if n <= 1 else min(2.0 ** (n - 2), MAX_BACKOFF_S)


def spawn_actor(name: str, config_json: bytes) -> subprocess.Popen:
    """Start ``python -m houchu.actors.runtime NAME`` with ``config_json`` on its stdin.

    Its stdout and stderr are the launcher's. Raises OSError if it cannot be started.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "houchu.actors.runtime", name], stdin=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(config_json)
    except BrokenPipeError:  # it died at once; the supervisor sees the exit code
        pass
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    return proc


def describe_exit(code: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class ActorProcess:
    """One actor's current process.

    ``generation``: 0 for the first process, +1 per restart; ``started_at``,
    ``last_beat``: monotonic seconds; ``busy_s``: from its last heartbeat;
    ``kill_reason``: why the supervisor killed it, if it did.
    """

    name: str
    generation: int
    proc: subprocess.Popen
    started_at: float
    ready: bool = False
    last_beat: float = 0.0
    busy_s: float = 0.0
    kill_reason: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, reason: str) -> None:
        """SIGKILL the process (works on a stopped one too); the death is seen later."""
        if self.kill_reason is None:
            self.kill_reason = reason
        if self.proc.poll() is None:
            self.proc.kill()


class SupervisorStop(Exception):
    """The server must stop: an actor's restart budget is spent."""


def _say(text: str, err: bool = False) -> None:
    print(f"houchu: {text}", file=sys.stderr if err else sys.stdout, flush=True)


class Supervisor:
    """Starts the actor processes and keeps them running.

    Args:
        ctx: the launcher's asyncio ZeroMQ context.
        config: the serving configuration (endpoints filled in), sent to every actor.
        actors: the actor names, in start order.
    """

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig, actors: tuple[str, ...]):
        self.config = config
        self.actors = actors
        self.payload = config.to_json()
        self.procs: dict[str, ActorProcess] = {}
        self.outboxes = {name: Outbox(ctx, config.endpoints[name]) for name in actors}
        s = config.supervision
        self.budgets = {n: RestartBudget(s.max_restarts, s.restart_window) for n in actors}
        self.pending: dict[str, tuple[float, int]] = {}  # name -> (restart time, generation)
        self.given_up: set[str] = set()
        self.num_restarts = 0
        self._last_tick: float | None = None  # monotonic seconds of the last tick

    # ------------------------------------------------------------------ processes

    def spawn(self, name: str, generation: int = 0) -> ActorProcess:
        """Start a process for ``name`` (its old outbox queue is dropped first)."""
        if generation > 0:
            self.outboxes[name].reconnect()
        now = time.monotonic()
        ap = ActorProcess(name, generation, spawn_actor(name, self.payload), now, last_beat=now)
        self.procs[name] = ap
        return ap

    def spawn_all(self) -> None:
        for name in self.actors:
            self.spawn(name)

    def exited(self) -> list[ActorProcess]:
        """Processes that have exited (their exit status is collected)."""
        return [ap for ap in self.procs.values() if ap.proc.poll() is not None]

    # ------------------------------------------------------------------ messages

    async def handle(self, msg: LauncherInbox) -> None:
        """A message from an actor, after start-up."""
        match msg:
            case Heartbeat(name=name, pid=pid, busy_s=busy):
                ap = self.procs.get(name)
                if ap is not None and ap.pid == pid:
                    ap.last_beat, ap.busy_s = time.monotonic(), busy
            case ActorReady(name=name, pid=pid, info=info):
                ap = self.procs.get(name)
                if ap is None or ap.pid != pid or ap.ready:
                    return
                ap.ready, ap.last_beat, ap.busy_s = True, time.monotonic(), 0.0
                if ap.generation == 0:
                    _say(f"{name} ready (pid {pid}) {info}")
                    return
                _say(f"{name} restarted (pid {pid}, generation {ap.generation}) {info}")
                await self.broadcast(ActorUp(name=name, generation=ap.generation), skip=name)
            case ActorFailed(name=name, error=error):
                _say(f"actor {name} failed: {error}", err=True)
            case ActorStuck(name=name, reason=reason):
                ap = self.procs.get(name)
                if ap is not None and ap.ready:
                    _say(f"actor {name} is stuck ({reason}); restarting it", err=True)
                    ap.kill(reason)

    async def broadcast(self, msg: ActorDown | ActorUp, skip: str) -> None:
        """Send ``msg`` to every live actor but ``skip`` (starting ones get it queued)."""
        for name in self.procs:
            if name != skip:
                await self.outboxes[name].send(msg)

    # ------------------------------------------------------------------ the watch

    async def tick(self) -> None:
        """Check every process once: deaths, hangs, start-up timeouts, due restarts.

        Raises:
            SupervisorStop: an essential actor's restart budget is spent.
        """
        now = time.monotonic()
        heartbeat_timeout = self.config.supervision.heartbeat_timeout
        ready_timeout_s = self.config.timings.ready_timeout_s
        self._forgive_own_pause(now, min(PAUSE_GAP_S, heartbeat_timeout / 2))
        for ap in list(self.procs.values()):
            if ap.proc.poll() is not None:
                await self._on_death(ap)
            elif ap.ready and now - ap.last_beat > heartbeat_timeout:
                ap.kill(f"no heartbeat for {now - ap.last_beat:.0f} s")
            elif ap.ready and ap.busy_s > heartbeat_timeout:
                ap.kill(f"one step has run for {ap.busy_s:.0f} s")
            elif not ap.ready and now - ap.started_at > ready_timeout_s:
                ap.kill(f"not ready after {ready_timeout_s:.0f} s")
        for name, (at, generation) in list(self.pending.items()):
            if now >= at:
                del self.pending[name]
                ap = self.spawn(name, generation)
                _say(f"restarting {name} (pid {ap.pid}, generation {generation})")

    def _forgive_own_pause(self, now: float, gap_s: float) -> None:
        """When the supervisor itself did not run for more than ``gap_s`` seconds since
        its last tick (the host paused the machine, or starved this process), the
        heartbeats of that time are still unread in its inbox: every actor's silence is
        then the supervisor's own, so each gets that time again before it is judged (a
        host pause killed and restarted every actor at once before)."""
        gap = now - self._last_tick if self._last_tick is not None else 0.0
        self._last_tick = now
        if gap <= gap_s:
            return
        _say(
            f"the supervisor did not run for {gap:.0f} s (host paused or starved): "
            "not counted against the actors' heartbeats",
            err=True,
        )
        for ap in self.procs.values():
            ap.last_beat += gap
            ap.started_at += gap

    async def _on_death(self, ap: ActorProcess) -> None:
        name = ap.name
        del self.procs[name]
        why = describe_exit(ap.proc.returncode)
        if ap.kill_reason is not None:
            why = f"{ap.kill_reason}; {why}"
        _say(f"actor {name} died (pid {ap.pid}, {why})", err=True)
        budget = self.budgets[name]
        allowed = budget.on_death()
        # Let the dead process's last messages reach their inboxes before the news.
        await asyncio.sleep(0.05)
        await self.broadcast(ActorDown(name=name, generation=ap.generation + 1), skip=name)
        if not allowed:
            limit = (
                f"{budget.recent} deaths in {budget.window_s:.0f} s, at most "
                f"{budget.max_restarts} restarts allowed (--max-restarts, --restart-window)"
            )
            if name in OPTIONAL_ACTORS:
                self.given_up.add(name)
                _say(f"actor {name} keeps dying ({limit}); serving on without it", err=True)
                return
            raise SupervisorStop(f"actor {name} keeps dying ({limit}); stopping the server")
        delay = budget.backoff_s()
        self.pending[name] = (time.monotonic() + delay, ap.generation + 1)
        self.num_restarts += 1
        if delay > 0:
            _say(f"restarting {name} in {delay:.0f} s")

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Ask every live actor to stop (the gateway first), then terminate and finally
        kill stragglers; close the outboxes."""
        self.pending.clear()
        for name in reversed(self.actors):  # gateway first: stop taking requests
            ap = self.procs.get(name)
            if ap is not None and ap.proc.poll() is None:
                await self.outboxes[name].send(Shutdown("launcher"))
        procs = [ap.proc for ap in self.procs.values()]
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(1.0)
        for out in self.outboxes.values():
            out.close()
