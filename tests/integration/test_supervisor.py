"""The supervisor: restart budget and backoff, a SIGSTOP'd actor found by its missing
heartbeat and restarted, a crash loop that stops the server, and the links that follow a
peer's restart. Real actor processes (the recorder, on a temporary SQLite file; a gateway
that cannot load its model), no model."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import zmq.asyncio

from houchu.actors.supervisor import (
    MAX_BACKOFF_S,
    RestartBudget,
    Supervisor,
    SupervisorStop,
    describe_exit,
)
from houchu.options.serve_config import Launch, ServeConfig, Timings
from houchu.options.supervision_options import SupervisionOptions
from houchu.options.telemetry_options import TelemetryOptions
from houchu.transport.channel import Inbox, Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import ActorDown, ActorUp, LauncherInbox, Shutdown
from houchu.transport.peers import Peers, drain

pytestmark = pytest.mark.slow


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_budget_allows_max_restarts_per_window_then_refuses():
    clock = FakeClock()
    budget = RestartBudget(3, 60.0, clock)
    assert [budget.on_death() for _ in range(3)] == [True, True, True]
    clock.t += 30.0
    assert budget.on_death() is False  # a 4th death within 60 s
    clock.t += 31.0  # the first three are now older than the window
    assert budget.recent == 1
    assert budget.on_death() is True


def test_backoff_grows_and_is_capped():
    clock = FakeClock()
    budget = RestartBudget(100, 60.0, clock)
    delays = []
    for _ in range(7):
        budget.on_death()
        delays.append(budget.backoff_s())
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, MAX_BACKOFF_S, MAX_BACKOFF_S]
    clock.t += 61.0
    budget.on_death()
    assert budget.backoff_s() == 0.0  # a death long after the others restarts at once


def test_budget_rejects_bad_limits():
    with pytest.raises(ValueError):
        RestartBudget(-1, 60.0)
    with pytest.raises(ValueError):
        RestartBudget(3, 0.0)


def test_describe_exit():
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"


def _config(run_dir: Path, db_url: str | None = None, **supervision: float | int) -> ServeConfig:
    return ServeConfig(
        model=str(run_dir / "no-such-model.gguf"),
        telemetry=TelemetryOptions(db_url=db_url or f"sqlite:///{run_dir / 'telemetry.db'}"),
        supervision=SupervisionOptions(**{"heartbeat_timeout": 3.0, **supervision}),
        timings=Timings(heartbeat_interval_s=0.2, ready_timeout_s=120.0),
        launch=Launch(endpoints=Endpoints.ipc(run_dir)),
    )


async def _drive(sup: Supervisor, inbox: Inbox, until, timeout_s: float) -> None:
    """Run the supervisor's loop (as the launcher does) until ``until()`` is true."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, f"timed out; processes: {sup.procs}"
        await sup.tick()
        if await inbox.poll(0.1):
            while (msg := inbox.recv_nowait()) is not None:
                await sup.handle(msg)


async def test_sigstopped_actor_is_killed_and_restarted(tmp_path):
    ctx = zmq.asyncio.Context()
    config = _config(tmp_path)
    inbox: Inbox[LauncherInbox] = Inbox(ctx, config.endpoints["launcher"], LauncherInbox)
    sup = Supervisor(ctx, config, ("recorder",))
    try:
        sup.spawn_all()
        await _drive(sup, inbox, lambda: sup.procs["recorder"].ready, 120)
        first = sup.procs["recorder"]
        os.kill(first.pid, signal.SIGSTOP)
        t0 = time.monotonic()

        def replaced() -> bool:
            ap = sup.procs.get("recorder")
            return ap is not None and ap is not first and ap.ready

        await _drive(sup, inbox, replaced, 120)
        second = sup.procs["recorder"]
        assert second.pid != first.pid and second.generation == 1
        assert first.proc.returncode == -signal.SIGKILL
        assert first.kill_reason is not None and "no heartbeat" in first.kill_reason
        # found after the heartbeat timeout, not before
        assert time.monotonic() - t0 >= config.supervision.heartbeat_timeout
        await _drive(sup, inbox, lambda: time.monotonic() - t0 > 8, 30)  # it keeps beating
        assert sup.procs["recorder"] is second and second.proc.poll() is None
    finally:
        await sup.shutdown()
        inbox.close()
        ctx.destroy(linger=0)


async def test_crash_loop_stops_the_server_when_the_budget_is_spent(tmp_path):
    ctx = zmq.asyncio.Context()
    config = _config(tmp_path, max_restarts=2, restart_window=120.0)
    inbox: Inbox[LauncherInbox] = Inbox(ctx, config.endpoints["launcher"], LauncherInbox)
    sup = Supervisor(ctx, config, ("gateway",))  # its model does not exist: it always fails
    try:
        sup.spawn_all()
        with pytest.raises(SupervisorStop, match="gateway keeps dying"):
            await _drive(sup, inbox, lambda: False, 180)
        assert sup.num_restarts == 2
    finally:
        await sup.shutdown()
        inbox.close()
        ctx.destroy(linger=0)


async def test_optional_actor_is_given_up_not_fatal(tmp_path):
    ctx = zmq.asyncio.Context()
    config = _config(tmp_path, max_restarts=0, db_url="nosuchdialect://x")
    inbox: Inbox[LauncherInbox] = Inbox(ctx, config.endpoints["launcher"], LauncherInbox)
    sup = Supervisor(ctx, config, ("recorder",))  # a bad database URL: it fails at start
    try:
        sup.spawn_all()
        await _drive(sup, inbox, lambda: "recorder" in sup.given_up, 120)
        assert not sup.procs and not sup.pending
    finally:
        await sup.shutdown()
        inbox.close()
        ctx.destroy(linger=0)


async def _wait_for_a_connect_retry(out: Outbox, timeout_s: float = 10.0) -> None:
    """Wait until ``out``'s socket has tried its peer's address, failed, and set itself
    to try again (ZeroMQ's ``EVENT_CONNECT_RETRIED``): a link to a peer that is gone."""
    from zmq.utils.monitor import parse_monitor_message

    sock = out._sock
    mon = sock.get_monitor_socket(zmq.EVENT_CONNECT_RETRIED)

    async def retried() -> None:
        while parse_monitor_message(await mon.recv_multipart())["event"] != (
            zmq.EVENT_CONNECT_RETRIED
        ):
            pass

    try:
        await asyncio.wait_for(retried(), timeout_s)
    finally:
        sock.disable_monitor()
        mon.close(linger=0)


async def test_reconnected_link_drops_what_was_queued_for_the_dead_peer(tmp_path):
    """Messages sent to a peer that is gone never reach its replacement once the link is
    reconnected; messages sent after the reconnect do."""
    ctx = zmq.asyncio.Context()
    ep = Endpoints.ipc(tmp_path)
    peers = Peers(ctx, ep)
    out = peers.outbox("tokenizer")
    await out.send(ActorUp(name="old", generation=0))  # nobody is listening yet
    await _wait_for_a_connect_retry(out)  # the message waits in the queue of a retrying link
    assert peers.reconnect("tokenizer") == 1
    await out.send(ActorUp(name="new", generation=1))
    inbox: Inbox = Inbox(ctx, ep["tokenizer"], ActorUp | ActorDown | Shutdown)
    got = await asyncio.wait_for(inbox.recv(), 5)
    assert got == ActorUp(name="new", generation=1)
    assert not await inbox.poll(0.2)
    peers.close()
    inbox.close()
    ctx.destroy(linger=0)


async def test_drain_handles_queued_messages_and_stops_at_shutdown(tmp_path):
    """Over inproc links: a message sent is in the inbox's queue when ``send`` returns,
    so all three are queued before the first drain (no wait for them to travel)."""
    ctx = zmq.asyncio.Context()
    ep = Endpoints.inproc(f"drain-{tmp_path.name}")
    inbox: Inbox = Inbox(ctx, ep["draft"], ActorUp | ActorDown | Shutdown)
    peers = Peers(ctx, ep)
    out = peers.outbox("draft")
    for m in (ActorUp(name="a", generation=1), Shutdown(), ActorUp(name="b", generation=1)):
        await out.send(m)
    assert await inbox.poll(5)
    seen = []

    async def handle(msg) -> bool:
        seen.append(msg)
        return not isinstance(msg, Shutdown)

    assert await drain(inbox, handle, "test") is False
    assert seen == [ActorUp(name="a", generation=1), Shutdown()]
    assert await drain(inbox, handle, "test") is True
    assert seen[-1] == ActorUp(name="b", generation=1)
    peers.close()
    inbox.close()
    ctx.destroy(linger=0)


async def test_a_pause_of_the_supervisor_itself_kills_no_actor(tmp_path):
    """A host pause stops the supervisor too: the heartbeats of that time wait unread in
    its inbox, and every actor looked silent (all were killed and restarted at once)."""
    ctx = zmq.asyncio.Context()
    config = _config(tmp_path)
    inbox: Inbox[LauncherInbox] = Inbox(ctx, config.endpoints["launcher"], LauncherInbox)
    sup = Supervisor(ctx, config, ("recorder",))
    try:
        sup.spawn_all()
        await _drive(sup, inbox, lambda: sup.procs["recorder"].ready, 120)
        first = sup.procs["recorder"]
        await asyncio.sleep(config.supervision.heartbeat_timeout + 1.0)  # no tick, no inbox
        await sup.tick()
        assert first.kill_reason is None and first.proc.poll() is None
        t0 = time.monotonic()
        await _drive(sup, inbox, lambda: time.monotonic() - t0 > 2, 30)  # it keeps beating
        assert sup.procs["recorder"] is first and first.kill_reason is None
    finally:
        await sup.shutdown()
        inbox.close()
        ctx.destroy(linger=0)
