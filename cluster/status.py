"""The replicas' dashboard: what each replica and the router say, polled every second,
served by the cluster launcher on its own port (``houchu.cluster.plan.cluster_ports``).

Routes:

- ``GET /dashboard``: the page (``dashboard/static/replicas.html``), one row per
  replica: its state, load, prefix hit rate, restarts, and links to its own dashboard
  and ``/metrics``; and the router's policy.
- ``GET /dashboard/api/replicas``: the same as JSON (``ClusterStatus.snapshot``).

Each replica's figures come from its ``/health`` and ``/stats``; the router's view of
it (healthy or not, in rotation or not, its load) from ``smg``'s ``GET /workers``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

#: seconds each poll may take
POLL_TIMEOUT_S = 2.0
STATIC = Path(__file__).resolve().parent.parent / "dashboard" / "static"


async def _get_json(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """(HTTP status, JSON body or None); status 0 when it could not be reached."""
    try:
        timeout = aiohttp.ClientTimeout(total=POLL_TIMEOUT_S)
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            return resp.status, body
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return 0, None


def replica_figures(health: tuple[int, Any], stats: tuple[int, Any]) -> dict[str, Any]:
    """A replica's row from its ``/health`` and ``/stats`` answers (``_get_json``):
    ``health`` ("ok", "starting", "unavailable" or "unreachable"), requests running and
    waiting, requests finished, and the prefix hit rate (prompt tokens found in the
    prefix cache / prompt tokens looked up; None before the first lookup)."""
    status, body = health
    if status == 0:
        word = "unreachable"
    else:
        word = body.get("status", "unavailable") if isinstance(body, dict) else "unavailable"
    st = stats[1] if stats[0] == 200 and isinstance(stats[1], dict) else {}
    queried = float(st.get("prefix_tokens_queried") or 0)
    reused = float(st.get("prefix_tokens_reused") or 0)
    return {
        "health": word,
        "num_running": st.get("num_running"),
        "num_waiting": st.get("num_waiting"),
        "num_finished": st.get("num_finished"),
        "prefix_tokens_queried": queried,
        "prefix_tokens_reused": reused,
        "prefix_hit_rate": reused / queried if queried else None,
    }


def router_views(workers: tuple[int, Any]) -> dict[str, dict[str, Any]]:
    """The router's view of each worker, by URL, from ``smg``'s ``GET /workers``:
    ``is_healthy``, ``status`` ("ready", "not_ready", ...) and ``load`` (its requests
    in flight through the router)."""
    status, body = workers
    if status != 200 or not isinstance(body, dict):
        return {}
    out = {}
    for w in body.get("workers", []):
        if isinstance(w, dict) and "url" in w:
            out[w["url"]] = {k: w.get(k) for k in ("is_healthy", "status", "load")}
    return out


class ClusterStatus:
    """The latest figures of every replica and of the router.

    Args:
        replicas: the launcher's ``ReplicaProcess`` list (read for state, pid, restarts).
        router_url: the router's base URL (for ``/workers``).
        policy: the router's policy.
        public_host: the host the links on the page name.
        api_key: the replicas' ``--api-key`` (their ``/stats`` needs it), or None.
    """

    def __init__(
        self,
        replicas: list,
        router_url: str,
        policy: str,
        public_host: str,
        api_key: str | None = None,
    ) -> None:
        self.replicas = replicas
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.router_url = router_url
        self.policy = policy
        self.public_host = public_host
        self.router_state = "starting"
        self.figures: dict[int, dict[str, Any]] = {}
        self.router: dict[str, dict[str, Any]] = {}
        self.polled_at = 0.0

    async def poll(self, session: aiohttp.ClientSession) -> None:
        """Ask every replica and the router once, concurrently."""
        urls = [r.plan.url for r in self.replicas]
        calls = [
            _get_json(session, f"{u}{p}", self.headers) for u in urls for p in ("/health", "/stats")
        ]
        # the router is started with the same API key as the replicas and asks for it
        calls.append(_get_json(session, f"{self.router_url}/workers", self.headers))
        answers = await asyncio.gather(*calls)
        for i, _ in enumerate(urls):
            self.figures[i] = replica_figures(answers[2 * i], answers[2 * i + 1])
        self.router = router_views(answers[-1])
        self.polled_at = time.time()

    def health_of(self, index: int) -> str | None:
        """Replica ``index``'s last ``/health`` word (None before the first poll)."""
        return self.figures.get(index, {}).get("health")

    def snapshot(self) -> dict[str, Any]:
        """The JSON of ``/dashboard/api/replicas``."""
        rows = []
        for i, r in enumerate(self.replicas):
            base = f"http://{self.public_host}:{r.plan.port}"
            rows.append(
                {
                    "index": i,
                    "url": r.plan.url,
                    "pid": r.pid,
                    "state": r.state,
                    "restarts": r.restarts,
                    "cores": list(r.plan.cores) if r.plan.cores is not None else None,
                    "threads": r.plan.config.runner.threads,
                    "device": r.plan.config.runner.device,
                    "dashboard_url": f"{base}/dashboard",
                    "metrics_url": f"{base}/metrics",
                    **self.figures.get(i, {}),
                    "router": self.router.get(r.plan.url),
                }
            )
        return {
            "policy": self.policy,
            "router": {"url": self.router_url, "state": self.router_state},
            "polled_at": self.polled_at,
            "replicas": rows,
        }


STATUS_KEY: web.AppKey[ClusterStatus] = web.AppKey("houchu_cluster_status", ClusterStatus)


async def replicas_page(request: web.Request) -> web.FileResponse:
    """``GET /dashboard``: the replicas' page."""
    return web.FileResponse(STATIC / "replicas.html")


async def replicas_api(request: web.Request) -> web.Response:
    """``GET /dashboard/api/replicas``: ``ClusterStatus.snapshot``."""
    return web.json_response(request.app[STATUS_KEY].snapshot())


def make_status_app(status: ClusterStatus) -> web.Application:
    """The replicas' dashboard application."""
    app = web.Application()
    app[STATUS_KEY] = status
    app.router.add_get("/dashboard", replicas_page)
    app.router.add_get("/dashboard/api/replicas", replicas_api)
    app.router.add_static("/dashboard/static", STATIC)
    return app
