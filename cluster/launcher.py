"""The cluster launcher of ``houchu serve --data-parallel-size N``: N replicas, ``smg``
in front of them, and the replicas' dashboard; restarts what dies.

Start: every replica (``houchu.cluster.replica``: a whole ``houchu serve`` in a
process group of its own) is started at once; when all answer ``/health`` with 200 the
router starts (``smg launch --worker-urls ...``), then the dashboard; then the line
``houchu: serving MODEL at http://HOST:PORT``.

Faults: a replica whose launcher exits is cleaned up whole (its process group killed)
and started again after the supervisor's backoff, within the same restart budget as an
actor (``--max-restarts`` per ``--restart-window``; once spent the replica stays down
and the others serve on; when none is left the server stops). Meanwhile the router's
health probes take it out of rotation (its port refuses, then its ``/health`` answers
503 while the model loads), requests that fail before their response started are
retried by the router on another replica, and streams that were running on it end with
the router's error event. A dead router is started again the same way. Within a
replica, its own supervisor restarts its actors (``houchu.actors.supervisor``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
from aiohttp import web

from houchu.actors.supervisor import RestartBudget, describe_exit
from houchu.cluster.plan import ClusterPorts, ReplicaPlan, cluster_ports, plan_replicas
from houchu.cluster.replica import ReplicaProcess, child_setup
from houchu.cluster.router import find_smg, router_command
from houchu.cluster.status import ClusterStatus, make_status_app
from houchu.options.serve_config import ServeConfig
from houchu.paths import cache_dir

#: Seconds between two checks of the processes (and polls of the replicas).
WATCH_TICK_S = 0.5
#: Seconds the router may take to list every replica as ready at start.
ROUTER_READY_TIMEOUT_S = 60.0
#: Seconds the router may take to stop (it lets requests in flight finish first).
ROUTER_GRACE_S = 15.0


def _say(text: str, err: bool = False) -> None:
    print(f"houchu: {text}", file=sys.stderr if err else sys.stdout, flush=True)


class ClusterError(RuntimeError):
    """The replicas or the router could not be started."""


def cuda_count(device: str) -> int:
    """GPUs torch sees (0 without importing torch when ``device`` is ``cpu``)."""
    if device == "cpu":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class ClusterLauncher:
    """Owns the replica processes, the router process and the dashboard.

    Args:
        config: the whole server's configuration (``cluster.data_parallel_size`` > 1).
        plans: the replicas (None: ``plan_replicas`` on this machine's cores and GPUs).

    Raises:
        houchu.cluster.router.RouterMissing: ``smg`` is not installed.
        houchu.cluster.plan.ClusterPlanError: the replicas cannot be placed.
    """

    def __init__(self, config: ServeConfig, plans: list[ReplicaPlan] | None = None) -> None:
        self.config = config
        self.smg = find_smg()
        self.ports: ClusterPorts = cluster_ports(config)
        if plans is None:
            cores = sorted(os.sched_getaffinity(0))
            gpus = cuda_count(config.runner.device)
            plans = plan_replicas(config, cores, gpus, str(cache_dir()))
        self.replicas = [ReplicaProcess(p) for p in plans]
        s = config.supervision
        self.budgets = [RestartBudget(s.max_restarts, s.restart_window) for _ in plans]
        self.router_budget = RestartBudget(s.max_restarts, s.restart_window)
        self.due: dict[int, float] = {}  # replica index -> monotonic time of its restart
        self.router: subprocess.Popen | None = None
        host = config.gateway.host
        local = "127.0.0.1" if host in ("0.0.0.0", "localhost", "::", "::1") else host
        self.status = ClusterStatus(
            self.replicas,
            f"http://{local}:{self.ports.router}",
            config.cluster.router_policy,
            local,
            api_key=config.gateway.api_key,  # smg and the replicas ask for it
        )
        self._stop = asyncio.Event()

    # ------------------------------------------------------------------ processes

    def _start_router(self) -> None:
        c = self.config
        cmd = router_command(
            self.smg,
            host=c.gateway.host,
            port=self.ports.router,
            worker_urls=[r.plan.url for r in self.replicas],
            policy=c.cluster.router_policy,
            metrics_port=self.ports.router_metrics,
            extra=c.cluster.router_args,
            api_key=c.gateway.api_key,
        )
        self.router = subprocess.Popen(cmd, start_new_session=True, preexec_fn=child_setup())
        self.status.router_state = "starting"

    async def _wait_replicas(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + self.config.timings.ready_timeout_s
        while not all(r.state == "ready" for r in self.replicas):
            if self._stop.is_set():
                raise ClusterError("interrupted while starting")
            for r in self.replicas:
                if r.exited():
                    why = describe_exit(r.proc.returncode)  # type: ignore[union-attr]
                    raise ClusterError(f"replica {r.plan.index} exited while starting ({why})")
            if time.monotonic() > deadline:
                raise ClusterError("replicas not ready in time")
            await self.status.poll(session)
            self._note_ready()
            await asyncio.sleep(WATCH_TICK_S)

    async def _wait_router(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + ROUTER_READY_TIMEOUT_S
        n = len(self.replicas)
        while True:
            if self.router is not None and self.router.poll() is not None:
                raise ClusterError(f"smg exited ({describe_exit(self.router.returncode)})")
            await self.status.poll(session)
            ready = [v for v in self.status.router.values() if v.get("status") == "ready"]
            if len(ready) == n:
                self.status.router_state = "ready"
                return
            if time.monotonic() > deadline or self._stop.is_set():
                raise ClusterError(f"smg lists {len(ready)} of {n} replicas ready")
            await asyncio.sleep(WATCH_TICK_S)

    def _note_ready(self) -> None:
        """Replicas that answer /health with 200 are ready."""
        for r in self.replicas:
            if r.state == "starting" and self.status.health_of(r.plan.index) == "ok":
                r.state = "ready"
                what = "ready" if r.restarts == 0 else f"restarted ({r.restarts})"
                _say(f"replica {r.plan.index} {what} at {r.plan.url} (pid {r.pid})")

    def _on_replica_death(self, r: ReplicaProcess) -> None:
        i = r.plan.index
        why = describe_exit(r.proc.returncode)  # type: ignore[union-attr]
        r.kill_group()
        _say(f"replica {i} died (pid {r.pid}, {why})", err=True)
        if not self.budgets[i].on_death():
            r.state = "failed"
            _say(f"replica {i} keeps dying (--max-restarts); serving on without it", err=True)
            return
        r.state = "restarting"
        self.due[i] = time.monotonic() + self.budgets[i].backoff_s()

    def _check_processes(self) -> None:
        """Deaths, due restarts; the router too.

        Raises:
            ClusterError: every replica has failed, or the router keeps dying.
        """
        now = time.monotonic()
        for r in self.replicas:
            if r.state in ("starting", "ready") and r.exited():
                self._on_replica_death(r)
        for i, at in list(self.due.items()):
            if now >= at:
                del self.due[i]
                r = self.replicas[i]
                r.restarts += 1
                r.start()
                _say(f"restarting replica {i} (pid {r.pid})")
        if all(r.state == "failed" for r in self.replicas):
            raise ClusterError("every replica has failed; stopping the server")
        if self.router is not None and self.router.poll() is not None:
            _say(f"smg died ({describe_exit(self.router.returncode)})", err=True)
            if not self.router_budget.on_death():
                raise ClusterError("smg keeps dying (--max-restarts); stopping the server")
            self._start_router()

    # ------------------------------------------------------------------ serve

    async def serve(self) -> int:
        """Start everything, serve until a signal or an unrecoverable failure; the exit
        code (0 after a requested shutdown)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        c, n = self.config, len(self.replicas)
        runner: web.AppRunner | None = None
        code = 0
        async with aiohttp.ClientSession() as session:
            try:
                for r in self.replicas:
                    r.start()
                    _say(f"replica {r.plan.index} starting (pid {r.pid}) on {r.plan.url}")
                await self._wait_replicas(session)
                self._start_router()
                await self._wait_router(session)
                runner = web.AppRunner(make_status_app(self.status), access_log=None)
                await runner.setup()
                await web.TCPSite(runner, c.gateway.host, self.ports.dashboard).start()
                pol = c.cluster.router_policy
                _say(
                    f"replicas' dashboard at http://{self.status.public_host}:{self.ports.dashboard}/dashboard"
                )
                _say(
                    f"serving {c.model_name()} at http://{c.gateway.host}:{self.ports.router} "
                    f"({n} replicas behind smg, policy {pol})"
                )
                _say("press Ctrl-C to stop")
                while not self._stop.is_set():
                    self._check_processes()
                    await self.status.poll(session)
                    self._note_ready()
                    self.status.router_state = "ready" if self.router else "down"
                    try:
                        await asyncio.wait_for(self._stop.wait(), WATCH_TICK_S)
                    except asyncio.TimeoutError:
                        pass
                _say("shutting down")
            except ClusterError as e:
                _say(str(e), err=True)
                code = 1
            finally:
                await self._shutdown(runner)
        return code

    async def _shutdown(self, runner: web.AppRunner | None) -> None:
        if runner is not None:
            await runner.cleanup()
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()  # first: no new requests reach the replicas
            deadline = time.monotonic() + ROUTER_GRACE_S
            while self.router.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.router.poll() is None:
                self.router.kill()
                self.router.wait(2.0)
        await asyncio.gather(*(r.stop() for r in self.replicas))
