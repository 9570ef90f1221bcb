"""The router in front of the replicas: SGLang's Model Gateway, ``smg launch``.

houchu ships no router of its own: ``smg`` (PyPI ``smg``, the Rust router formerly
``sglang-router``; ``pip install houchu[cluster]``) routes each request with its
``--policy`` (``cache_aware`` by default: an approximate radix tree of the prompts sent
to each worker, the longest match wins, shortest queue when the load is imbalanced),
probes every worker's ``/health`` and leaves a worker that fails out of rotation until
it answers again, and retries a request that failed before its response started on
another worker. It sees a houchu replica as a vLLM worker (``/version`` and
``/server_info`` answer; load from ``/metrics``'s ``vllm:*`` gauges).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

#: houchu's choices of ``smg launch`` flags, beside the worker URLs, port and policy:
#: probe each replica every second and take it out after 2 failed probes (a replica
#: that restarts answers 503 on /health until its model is loaded), back after 1 good
#: one; check a starting worker every second; log warnings only; on SIGTERM let requests
#: in flight finish for at most 10 s.
DEFAULT_ROUTER_FLAGS: dict[str, list[str]] = {
    "--health-check-interval-secs": ["1"],
    "--health-failure-threshold": ["2"],
    "--health-success-threshold": ["1"],
    "--health-check-timeout-secs": ["2"],
    "--worker-startup-check-interval": ["1"],
    "--log-level": ["warn"],
    "--shutdown-grace-period-secs": ["10"],
}


class RouterMissing(RuntimeError):
    """``smg`` is not installed."""


def find_smg() -> str:
    """The ``smg`` executable: beside this Python's (a virtual environment's ``bin``),
    else on ``PATH``.

    Raises:
        RouterMissing: neither has it; the message says how to install it.
    """
    beside = Path(sys.executable).parent / "smg"
    if beside.is_file():
        return str(beside)
    found = shutil.which("smg")
    if found is None:
        raise RouterMissing(
            "--data-parallel-size needs SGLang's Model Gateway (smg): pip install 'houchu[cluster]'"
        )
    return found


def _flag_names(args: list[str]) -> set[str]:
    """The ``--flag`` names in ``args`` (``--a=1`` counts as ``--a``)."""
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def router_command(
    smg: str,
    *,
    host: str,
    port: int,
    worker_urls: list[str],
    policy: str,
    metrics_port: int,
    extra: str = "",
    api_key: str | None = None,
) -> list[str]:
    """The ``smg launch`` command line in front of ``worker_urls``.

    Args:
        smg: the executable (``find_smg``).
        host, port: where the router listens (``houchu serve --host/--port``).
        worker_urls: the replicas' base URLs.
        policy: ``--router-policy``.
        metrics_port: the router's own Prometheus port (on 127.0.0.1).
        extra: ``--router-args``, shell-quoted; a flag given there replaces houchu's
            choice of the same flag (``DEFAULT_ROUTER_FLAGS``, the metrics port).
        api_key: the replicas' ``--api-key``: ``smg --api-key`` sends it to them (and
            asks it of the router's clients too).

    Raises:
        ValueError: ``extra`` is not valid shell quoting.
    """
    more = shlex.split(extra)
    given = _flag_names(more)
    cmd = [smg, "launch", "--host", host, "--port", str(port), "--worker-urls", *worker_urls]
    cmd += ["--policy", policy]
    ours = dict(DEFAULT_ROUTER_FLAGS)
    ours["--prometheus-port"] = [str(metrics_port)]
    ours["--prometheus-host"] = ["127.0.0.1"]
    if api_key:
        ours["--api-key"] = [api_key]
    for flag, values in ours.items():
        if flag not in given:
            cmd += [flag, *values]
    return cmd + more
