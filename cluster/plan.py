"""Where each replica of ``houchu serve --data-parallel-size N`` runs: its port, cores,
threads, device and telemetry database (pure: no process is started here).

Ports: ``smg`` takes ``--port`` P; replica i serves on P + 1 + i; the replicas'
dashboard is on P + N + 1 and ``smg``'s Prometheus metrics on P + N + 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgspec

from houchu.options.serve_config import ServeConfig


@dataclass(frozen=True)
class ReplicaPlan:
    """One replica: a whole ``houchu serve`` with its own actors.

    Attributes:
        index: 0 .. N-1.
        config: its configuration (data_parallel_size 1, its port, threads, device,
            telemetry database; it listens on ``--host`` like the router, so that its
            ``/metrics`` and dashboard stay reachable).
        cores: the CPU cores it is pinned to (None: not pinned).
    """

    index: int
    config: ServeConfig
    cores: tuple[int, ...] | None

    @property
    def port(self) -> int:
        return self.config.gateway.port

    @property
    def url(self) -> str:
        """Its base URL, as ``smg --worker-urls`` takes it (on this machine)."""
        host = self.config.gateway.host
        if host in ("0.0.0.0", "localhost", "::", "::1"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class ClusterPorts:
    """The ports of a data-parallel ``houchu serve`` (see the module docstring)."""

    router: int
    replicas: tuple[int, ...]
    dashboard: int
    router_metrics: int


class ClusterPlanError(ValueError):
    """The data-parallel configuration cannot run here (the message says why)."""


def cluster_ports(config: ServeConfig) -> ClusterPorts:
    """The ports of ``config``'s router, replicas, dashboard and router metrics.

    Raises:
        ClusterPlanError: the last of them is above 65535.
    """
    p, n = config.gateway.port, config.cluster.data_parallel_size
    ports = ClusterPorts(p, tuple(range(p + 1, p + 1 + n)), p + n + 1, p + n + 2)
    if ports.router_metrics > 65535:
        raise ClusterPlanError(
            f"--port {p} with --data-parallel-size {n} needs ports up to "
            f"{ports.router_metrics} (at most 65535)"
        )
    return ports


def split_cores(cores: list[int], n: int, threads: int | None) -> list[tuple[int, ...] | None]:
    """The cores of each of ``n`` replicas: consecutive runs of ``threads // n`` cores
    (``threads`` None: all of ``cores``); None for all when there are fewer cores than
    replicas (the replicas then share them, unpinned).

    Args:
        cores: the cores this process may run on (``os.sched_getaffinity``), ascending.
        n: replicas, >= 1.
        threads: ``--threads``, the cores of all the replicas together (None: all).
    """
    total = min(threads or len(cores), len(cores))
    per = total // n
    if per < 1:
        return [None] * n
    return [tuple(cores[i * per : (i + 1) * per]) for i in range(n)]


def replica_threads(threads: int | None, available: int, n: int) -> int:
    """Threads of each replica's runner: ``threads`` (or the cores available) split
    evenly over ``n`` replicas, at least 1."""
    return max(1, (threads or available) // n)


def replica_devices(device: str, n: int, cuda_count: int) -> list[str]:
    """Each replica's ``--device``: on CUDA (``cuda``, or ``auto`` with a GPU) replica i
    gets GPU ``i``; on the CPU every replica gets ``device``.

    Raises:
        ClusterPlanError: a CUDA device with fewer GPUs than replicas, or one GPU named
            (``cuda:N``) for several replicas.
    """
    if device.startswith("cuda:"):
        raise ClusterPlanError(
            f"--device {device} names one GPU; with --data-parallel-size {n} use --device "
            "cuda (replica i runs on GPU i)"
        )
    if device == "cpu" or (device == "auto" and cuda_count == 0):
        return [device] * n
    if cuda_count < n:
        raise ClusterPlanError(
            f"--data-parallel-size {n} on CUDA needs {n} GPUs, torch sees {cuda_count}"
        )
    return [f"cuda:{i}" for i in range(n)]


def replica_db_url(db_url: str | None, cache_dir: str, index: int) -> str:
    """Replica ``index``'s telemetry database: its own SQLite file beside the default
    one (``houchu-replica{index}.db``), or ``--db-url`` when one was given (shared by
    every replica)."""
    if db_url is not None:
        return db_url
    return f"sqlite:///{os.path.join(cache_dir, f'houchu-replica{index}.db')}"


def plan_replicas(
    config: ServeConfig, cores: list[int], cuda_count: int, cache_dir: str
) -> list[ReplicaPlan]:
    """The replicas of a data-parallel ``config``.

    Args:
        config: the whole server's configuration (``cluster.data_parallel_size`` > 1).
        cores: the cores this process may run on, ascending.
        cuda_count: GPUs torch sees (0 on a CPU-only machine).
        cache_dir: houchu's cache directory (the default telemetry databases).

    Raises:
        ClusterPlanError: see ``cluster_ports`` and ``replica_devices``.
    """
    n = config.cluster.data_parallel_size
    ports = cluster_ports(config)
    devices = replica_devices(config.runner.device, n, cuda_count)
    on_cpu = not devices[0].startswith("cuda")
    threads = replica_threads(config.runner.threads, len(cores), n)
    pinned = split_cores(cores, n, config.runner.threads) if on_cpu else [None] * n
    out = []
    for i in range(n):
        rep = msgspec.structs.replace
        replica = rep(
            config,
            gateway=rep(config.gateway, port=ports.replicas[i]),
            runner=rep(config.runner, threads=threads, device=devices[i]),
            telemetry=rep(
                config.telemetry,
                db_url=replica_db_url(config.telemetry.db_url, cache_dir, i),
            ),
            cluster=rep(config.cluster, data_parallel_size=1),
        )
        out.append(ReplicaPlan(i, replica, pinned[i]))
    return out
