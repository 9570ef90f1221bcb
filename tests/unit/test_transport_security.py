"""Actor sockets: CURVE on tcp://, the private ipc:// directory, oversized and garbage
frames at an inbox."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from houchu.actors.placement import PlacementError, free_ports, place_actors
from houchu.options.placement_options import PlacementOptions
from houchu.options.serve_config import Launch, ServeConfig
from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.endpoints import ACTORS, Endpoints
from houchu.transport.messages import AbortRequest, SchedulerInbox
from houchu.transport.security import CurveKeys, InsecureTransport
from tests.support.garbage_frames import GOOD, garbage

WAIT_S = 1.0


async def arrives(inbox: Inbox, timeout_s: float = WAIT_S) -> bool:
    """Whether a frame reaches ``inbox`` within ``timeout_s`` seconds."""
    return await inbox.poll(timeout_s)


@pytest.fixture
async def ctx():
    c = zmq.asyncio.Context()
    yield c
    c.destroy(linger=0)


def tcp_endpoints(keys: CurveKeys) -> Endpoints:
    ports = dict(zip(ACTORS, free_ports("127.0.0.1", len(ACTORS)), strict=True))
    return Endpoints.tcp("127.0.0.1", ports, keys)


async def test_curve_tcp_inbox_refuses_plain_and_foreign_clients(ctx) -> None:
    keys = CurveKeys.generate()
    ep = tcp_endpoints(keys)
    inbox: Inbox = Inbox(ctx, ep["scheduler"], SchedulerInbox)
    out = Outbox(ctx, ep["scheduler"])
    plain = ctx.socket(zmq.PUSH)
    plain.linger = 0
    foreign = ctx.socket(zmq.PUSH)  # knows the server key, but is not the run's client
    foreign.linger = 0
    fp, fs = zmq.curve_keypair()
    foreign.curve_serverkey = keys.server_public.encode()
    foreign.curve_publickey, foreign.curve_secretkey = fp, fs
    try:
        await out.send(AbortRequest("legit-1"))
        assert await arrives(inbox), "the run's own outbox must get through"
        assert await inbox.recv() == AbortRequest("legit-1")

        plain.connect(ep["scheduler"])
        foreign.connect(ep["scheduler"])
        frame = msgspec.msgpack.encode(AbortRequest("intruder"))
        for _ in range(3):
            for s in (plain, foreign):
                await s.send(frame)
        assert not await arrives(inbox), "a peer without the run's keys was heard"

        await out.send(AbortRequest("legit-2"))  # the inbox still serves its actor
        assert await arrives(inbox)
        assert await inbox.recv() == AbortRequest("legit-2")
    finally:
        for s in (plain, foreign):
            s.close(linger=0)
        out.close()
        inbox.close()


def test_tcp_without_keys_is_refused() -> None:
    with pytest.raises(InsecureTransport):
        Endpoints({"scheduler": "tcp://127.0.0.1:5999"})
    with pytest.raises(InsecureTransport):
        msgspec.json.decode(b'{"addresses": {"x": "tcp://127.0.0.1:1"}}', type=Endpoints)
    ctx = zmq.asyncio.Context()
    try:
        with pytest.raises(InsecureTransport):
            Inbox(ctx, "tcp://127.0.0.1:5998", SchedulerInbox)
        with pytest.raises(InsecureTransport):
            Outbox(ctx, "tcp://127.0.0.1:5997")
    finally:
        ctx.destroy(linger=0)


def test_keys_travel_with_the_config(tmp_path: Path) -> None:
    config = ServeConfig(
        model="m",
        placement=PlacementOptions(actor_transport="tcp"),
        launch=Launch(endpoints=Endpoints.ipc(tmp_path)),
    )
    placed = place_actors(config, tmp_path)
    decoded = ServeConfig.from_json(placed.to_json())
    assert decoded.endpoints.curve == placed.endpoints.curve is not None
    addresses = list(decoded.endpoints.addresses.values())
    assert all(a.startswith("tcp://127.0.0.1:") for a in addresses)
    assert len(set(addresses)) == len(ACTORS)
    assert placed.endpoints.curve.server_public != placed.endpoints.curve.client_public


def test_ipc_placement_needs_a_private_dir() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="houchu-test-"))  # as the launcher makes it
    try:
        assert run_dir.stat().st_mode & 0o777 == 0o700
        config = ServeConfig(model="m", launch=Launch(endpoints=Endpoints.inproc("x")))
        placed = place_actors(config, run_dir)
        assert placed.endpoints["scheduler"] == f"ipc://{run_dir}/scheduler.sock"
        os.chmod(run_dir, 0o755)
        with pytest.raises(PlacementError, match="0700"):
            place_actors(config, run_dir)
        udp = PlacementOptions(actor_transport="udp")  # type: ignore[arg-type]
        with pytest.raises(PlacementError, match="transport"):
            place_actors(msgspec.structs.replace(config, placement=udp), run_dir)
    finally:
        os.rmdir(run_dir)


async def test_oversized_frame_is_dropped_and_the_inbox_goes_on(ctx, tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/in.sock"
    inbox: Inbox = Inbox(ctx, address, SchedulerInbox, max_bytes=4096)
    raw = ctx.socket(zmq.PUSH)
    raw.linger = 0
    raw.connect(address)
    out = Outbox(ctx, address)
    try:
        await raw.send(b"\x91" + b"x" * 10_000)
        assert not await arrives(inbox, 0.5)
        await out.send(AbortRequest("after"))
        assert await arrives(inbox)
        assert await inbox.recv() == AbortRequest("after")
    finally:
        raw.close(linger=0)
        out.close()
        inbox.close()


def test_garbage_frames_are_rejected_at_the_boundary(tmp_path: Path) -> None:
    """Every hypothesis frame is a BadMessage (or a valid message), never anything else,
    and the inbox keeps decoding real messages after it."""
    tried = 0

    async def main(frames: list[bytes]) -> None:
        ctx = zmq.asyncio.Context()
        address = f"ipc://{tmp_path}/fuzz.sock"
        inbox: Inbox = Inbox(ctx, address, SchedulerInbox)
        raw = ctx.socket(zmq.PUSH)
        raw.connect(address)
        try:
            for f in frames:
                await raw.send(f)
                try:
                    await asyncio.wait_for(inbox.recv(), 2.0)
                except BadMessage:
                    pass
            await raw.send(GOOD)
            assert await asyncio.wait_for(inbox.recv(), 2.0) == AbortRequest("ok")
        finally:
            raw.close(linger=0)
            inbox.close()
            ctx.destroy(linger=0)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(garbage, min_size=1, max_size=10))
    def check(frames: list[bytes]) -> None:
        nonlocal tried
        tried += len(frames)
        asyncio.run(main(frames))

    check()
    print(f"inbox fuzz: {tried} garbage frames")


def test_a_launcher_that_did_not_place_the_actors_is_caught(tmp_path: Path) -> None:
    from houchu.actors.placement import check_placement

    ipc = ServeConfig(model="m", launch=Launch(endpoints=Endpoints.ipc(tmp_path)))
    check_placement(ipc)
    tcp = msgspec.structs.replace(ipc, placement=PlacementOptions(actor_transport="tcp"))
    with pytest.raises(PlacementError, match="place_actors"):
        check_placement(tcp)
    check_placement(place_actors(tcp, tmp_path))


def test_a_taken_http_port_is_found_before_the_actors_start() -> None:
    """``check_port_free``: a listening port raises PlacementError naming the address;
    a free port and port 0 pass; an unknown host is a PlacementError, not a crash."""
    import socket

    from houchu.actors.placement import check_port_free

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PlacementError, match=f"127.0.0.1:{port}: Address already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # released
    check_port_free("127.0.0.1", 0)
    with pytest.raises(PlacementError, match="cannot listen on no-such-host.invalid"):
        check_port_free("no-such-host.invalid", 8000)
