"""The data-parallel plan (ports, cores, threads, devices, databases), the smg command
line and the replicas' dashboard figures (``houchu.cluster``), without processes."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from houchu.cli.main import build_parser
from houchu.cluster.plan import (
    ClusterPlanError,
    cluster_ports,
    plan_replicas,
    replica_devices,
    split_cores,
)
from houchu.cluster.replica import ReplicaProcess
from houchu.cluster.router import router_command
from houchu.cluster.status import ClusterStatus, make_status_app, replica_figures, router_views
from houchu.options.checks import check_serve_args
from houchu.options.parser import config_from_args
from houchu.options.serve_config import ServeConfig


def config(*argv: str) -> ServeConfig:
    parser = build_parser()
    args = parser.parse_args(["serve", "--model", "/m.gguf", *argv])
    check_serve_args(parser, args)
    return config_from_args(args)


def test_ports_of_router_replicas_dashboard_and_metrics():
    p = cluster_ports(config("--port", "9000", "--data-parallel-size", "3"))
    assert (p.router, p.replicas, p.dashboard, p.router_metrics) == (
        9000,
        (9001, 9002, 9003),
        9004,
        9005,
    )
    with pytest.raises(ClusterPlanError, match="65535"):
        cluster_ports(config("--port", "65534", "--data-parallel-size", "2"))


def test_cores_and_threads_are_split():
    assert split_cores([0, 1, 2, 3], 2, None) == [(0, 1), (2, 3)]
    assert split_cores([0, 1, 2, 3], 2, 2) == [(0,), (1,)]
    assert split_cores([0], 2, None) == [None, None]  # fewer cores than replicas: shared
    plans = plan_replicas(
        config("--data-parallel-size", "2", "--threads", "2"), [0, 1, 2, 3], 0, "/c"
    )
    assert [p.config.runner.threads for p in plans] == [1, 1]
    assert [p.cores for p in plans] == [(0,), (1,)]
    assert [p.port for p in plans] == [8001, 8002]
    assert all(p.config.cluster.data_parallel_size == 1 for p in plans)
    assert [p.config.telemetry.db_url for p in plans] == [
        "sqlite:////c/houchu-replica0.db",
        "sqlite:////c/houchu-replica1.db",
    ]


def test_a_given_db_url_is_shared_and_other_options_pass_through():
    c = config("--data-parallel-size", "2", "--db-url", "sqlite:///x.db", "--page-size", "32")
    plans = plan_replicas(c, [0, 1], 0, "/c")
    assert {p.config.telemetry.db_url for p in plans} == {"sqlite:///x.db"}
    assert {p.config.runner.page_size for p in plans} == {32}


def test_one_gpu_per_replica():
    assert replica_devices("cuda", 2, 4) == ["cuda:0", "cuda:1"]
    assert replica_devices("auto", 2, 2) == ["cuda:0", "cuda:1"]
    assert replica_devices("auto", 2, 0) == ["auto", "auto"]
    assert replica_devices("cpu", 2, 8) == ["cpu", "cpu"]
    with pytest.raises(ClusterPlanError, match="needs 3 GPUs"):
        replica_devices("cuda", 3, 2)
    with pytest.raises(ClusterPlanError, match="names one GPU"):
        replica_devices("cuda:1", 2, 2)
    plans = plan_replicas(config("--data-parallel-size", "2", "--device", "cuda"), [0, 1], 2, "/c")
    assert [p.cores for p in plans] == [None, None]  # a GPU each, not pinned


def test_router_command_passes_the_policy_and_lets_router_args_win():
    cmd = router_command(
        "smg",
        host="127.0.0.1",
        port=9000,
        worker_urls=["http://127.0.0.1:9001", "http://127.0.0.1:9002"],
        policy="round_robin",
        metrics_port=9004,
        extra="--health-check-interval-secs 5 --balance-abs-threshold=1",
    )
    assert cmd[:2] == ["smg", "launch"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert cmd[cmd.index("--policy") + 1] == "round_robin"
    assert cmd[cmd.index("--prometheus-port") + 1] == "9004"
    assert cmd.count("--health-check-interval-secs") == 1  # ours dropped, theirs kept
    assert cmd[cmd.index("--health-check-interval-secs") + 1] == "5"
    assert cmd[-1] == "--balance-abs-threshold=1"
    assert "--api-key" not in cmd


def test_router_args_must_be_shell_quoting():
    parser = build_parser()
    args = parser.parse_args(["serve", "--router-args", "--x 'unterminated"])
    with pytest.raises(SystemExit):
        check_serve_args(parser, args)
    args = parser.parse_args(["serve", "--data-parallel-size", "0"])
    with pytest.raises(SystemExit):
        check_serve_args(parser, args)


@pytest.mark.parametrize(
    "argv", [["--router-policy", "round_robin"], ["--router-args", "--log-level info"]]
)
def test_router_flags_without_replicas_are_refused(argv, capsys):
    """The router's flags on a single engine (no router) are an error, not ignored."""
    parser = build_parser()
    with pytest.raises(SystemExit):
        check_serve_args(parser, parser.parse_args(["serve", *argv]))
    assert "set the router of --data-parallel-size > 1" in capsys.readouterr().err
    check_serve_args(parser, parser.parse_args(["serve", "--data-parallel-size", "2", *argv]))


def test_replica_figures_and_router_views():
    row = replica_figures(
        (200, {"status": "ok"}),
        (
            200,
            {
                "num_running": 2,
                "num_waiting": 1,
                "num_finished": 7,
                "prefix_tokens_queried": 400,
                "prefix_tokens_reused": 100,
            },
        ),
    )
    assert row["health"] == "ok" and row["prefix_hit_rate"] == 0.25
    assert (row["num_running"], row["num_waiting"], row["num_finished"]) == (2, 1, 7)
    down = replica_figures((0, None), (0, None))
    assert down["health"] == "unreachable" and down["prefix_hit_rate"] is None
    assert replica_figures((503, {"status": "starting"}), (503, None))["health"] == "starting"
    views = router_views(
        (
            200,
            {
                "workers": [
                    {"url": "http://a:1", "is_healthy": False, "status": "not_ready", "load": 0}
                ]
            },
        )
    )
    assert views == {"http://a:1": {"is_healthy": False, "status": "not_ready", "load": 0}}
    assert router_views((0, None)) == {}


async def test_dashboard_lists_every_replica_and_the_policy():
    plans = plan_replicas(config("--data-parallel-size", "2"), [0, 1], 0, "/c")
    reps = [ReplicaProcess(p) for p in plans]
    reps[1].state, reps[1].restarts = "restarting", 1
    status = ClusterStatus(reps, "http://127.0.0.1:8000", "cache_aware", "127.0.0.1")
    status.figures = {0: replica_figures((200, {"status": "ok"}), (200, {"num_running": 1}))}
    async with TestClient(TestServer(make_status_app(status))) as c:
        snap = await (await c.get("/dashboard/api/replicas")).json()
        page = await c.get("/dashboard")
        assert page.status == 200 and "replicas.js" in await page.text()
        assert (await c.get("/dashboard/static/replicas.js")).status == 200
    assert snap["policy"] == "cache_aware"
    assert [r["state"] for r in snap["replicas"]] == ["starting", "restarting"]
    assert snap["replicas"][0]["num_running"] == 1 and snap["replicas"][1]["restarts"] == 1
    assert snap["replicas"][0]["metrics_url"] == "http://127.0.0.1:8001/metrics"


async def _serve_on_two_ports(app) -> tuple[object, int]:  # noqa: ANN001 (web.Application)
    """``app`` served on 127.0.0.1 at two consecutive free ports P and P + 1: (the
    runner to clean up, P)."""
    import socket

    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for _ in range(20):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await web.TCPSite(runner, "127.0.0.1", port + 1).start()
            return runner, port
        except OSError:  # taken meanwhile: start again on others
            await runner.cleanup()
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.parametrize("key", ["sekrit", None])
async def test_the_launcher_polls_router_and_replicas_with_the_api_key(key):
    """With ``--api-key``, smg asks for it on ``/workers`` and the replicas on ``/stats``:
    the launcher's own status (as ``ClusterLauncher`` builds it) sends it. Polled without
    it, smg read "0 of N replicas ready" and the launcher gave up at start."""
    import aiohttp
    from aiohttp import web

    from houchu.cluster.launcher import ClusterLauncher

    seen: dict[str, str | None] = {}

    def guarded(path: str, body: dict, public: bool = False) -> web.RequestHandler:
        async def handler(request: web.Request) -> web.Response:
            seen[path] = request.headers.get("Authorization")
            if not public and key and seen[path] != f"Bearer {key}":
                return web.json_response({"error": "unauthorized"}, status=401)
            return web.json_response(body)

        return handler

    app = web.Application()
    worker = {"url": "http://a:1", "is_healthy": True, "status": "ready", "load": 0}
    app.router.add_get("/workers", guarded("/workers", {"workers": [worker]}))
    app.router.add_get("/health", guarded("/health", {"status": "ok"}, public=True))
    app.router.add_get("/stats", guarded("/stats", {"num_running": 3}))
    # the router's --port P and replica 0's P + 1 are both this app (replica 1: unused)
    runner, port = await _serve_on_two_ports(app)
    try:
        flags = ["--data-parallel-size", "2", "--port", str(port), "--host", "127.0.0.1"]
        cfg = config(*flags, *(("--api-key", key) if key else ()))
        launcher = ClusterLauncher(cfg, plans=plan_replicas(cfg, [0, 1], 0, "/c"))
        assert launcher.status.router_url == f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            await launcher.status.poll(session)
    finally:
        await runner.cleanup()
    bearer = f"Bearer {key}" if key else None
    assert seen == {"/workers": bearer, "/health": bearer, "/stats": bearer}
    assert launcher.status.router == {"http://a:1": {k: worker[k] for k in worker if k != "url"}}
    assert launcher.status.figures[0]["num_running"] == 3  # replica 0's /stats answered
    assert launcher.status.health_of(0) == "ok"


def test_replica_lines_name_their_replica():
    """The launcher's and the actors' lines of a replica name it; other lines pass as
    they are."""
    import io

    from houchu.cluster.replica import relay_output

    lines = b"houchu: serving m\nhouchu runner: llama 'm'\n[rank1]: boom\nhouchuX\n"
    out = io.StringIO()
    relay_output(1, io.BytesIO(lines), out)
    assert out.getvalue().splitlines() == [
        "houchu[replica 1]: serving m",
        "houchu[replica 1] runner: llama 'm'",
        "[rank1]: boom",
        "houchuX",
    ]
