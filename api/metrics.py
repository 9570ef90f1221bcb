"""Prometheus metrics (``GET /metrics``), in the usual ``houchu_*`` style.

Three sources, one registry per application (never the global one):

- the request path, observed in the gateway (``GatewayMetrics``): requests by outcome,
  TTFT / TPOT / E2E histograms (seconds, as the client sees them), prompt, generated
  and cached prompt tokens;
- the engine's counters (``engine.stats()``), read at each scrape: running and waiting
  requests, KV pages;
- the database (``ledger_totals``, ``counters``), read at each scrape: what each lever
  saved and spent, and telemetry records dropped.

The route itself (``houchu.api.app.metrics_endpoint``) sits with the application, above
the dashboard whose store and engine reads it takes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

#: Latency buckets, seconds (TTFT and E2E).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
#: Per-output-token buckets, seconds.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)
#: Engine counters exported as gauges: stats key -> (metric name, help).
ENGINE_GAUGES = {
    "num_running": ("houchu_num_requests_running", "Requests in the running batch."),
    "num_waiting": ("houchu_num_requests_waiting", "Requests waiting to be scheduled."),
    "num_pages_total": ("houchu_kv_pages_total", "KV pages in the device pool."),
    "num_pages_used": ("houchu_kv_pages_used", "KV pages held by running requests."),
    "num_pages_free": ("houchu_kv_pages_free", "KV pages free in the device pool."),
    "num_pages_cached": ("houchu_kv_pages_cached", "KV pages held by the radix prefix cache."),
    "prefix_hit_rate": ("houchu_prefix_cache_hit_ratio", "Prompt tokens reused / admitted."),
    "busy_fraction": ("houchu_runner_busy_ratio", "Fraction of time the runner computed."),
    "num_preemptions": (
        "houchu_preemptions",
        "Requests preempted (their KV dropped, recomputed on resume) since start.",
    ),
    "overlap_hidden_s": (
        "houchu_overlap_hidden_seconds",
        "Scheduler seconds that ran while the runner executed a step (overlap scheduler).",
    ),
}


def _unit(unit: str) -> str:
    """A unit as a label value (lower case, [a-z0-9_])."""
    return re.sub(r"[^a-z0-9_]+", "_", unit.lower()).strip("_") or "none"


class GatewayMetrics:
    """The gateway's request metrics, and the collectors of engine and database numbers.

    Args:
        registry: where the metrics live (a fresh one when None).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "houchu_requests", "Requests that ended, by outcome.", ["outcome"], registry=r
        )
        self.in_flight = Gauge("houchu_requests_in_flight", "Requests in progress.", registry=r)
        self.ttft = Histogram(
            "houchu_time_to_first_token_seconds",
            "Arrival to first streamed text, seconds.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "houchu_time_per_output_token_seconds",
            "Mean seconds per output token after the first.",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "houchu_e2e_request_latency_seconds",
            "Arrival to the final response, seconds.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "houchu_prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )
        self.generation_tokens = Counter(
            "houchu_generation_tokens", "Tokens generated for finished requests.", registry=r
        )
        self.cached_tokens = Counter(
            "houchu_prefix_cache_hit_tokens",
            "Prompt tokens whose KV was reused from the prefix cache.",
            registry=r,
        )
        self.snapshot = ScrapeSnapshot()
        r.register(self.snapshot)

    def observe_finished(
        self,
        *,
        ttft_s: float | None,
        e2e_s: float,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
    ) -> None:
        """A request that finished normally; latencies in seconds."""
        self.requests.labels("finished").inc()
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if completion_tokens > 1:
                self.tpot.observe(max(e2e_s - ttft_s, 0.0) / (completion_tokens - 1))
        self.e2e.observe(e2e_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.cached_tokens.inc(cached_tokens)

    def observe_ended(self, outcome: str) -> None:
        """A request that did not finish: ``outcome`` is "aborted" or "failed"."""
        self.requests.labels(outcome).inc()


class ScrapeSnapshot(Collector):
    """Engine and database numbers fetched just before a scrape (``update``)."""

    def __init__(self) -> None:
        self.stats: Mapping[str, Any] = {}
        self.model_name: str | None = None  # the served model id (update's)
        self.ledger: list[dict[str, Any]] = []
        self.counters: Mapping[str, float] = {}
        self.engine_up = 0

    def update(
        self,
        stats: Mapping[str, Any] | None,
        ledger: list[dict[str, Any]] | None,
        counters: Mapping[str, float] | None,
        model_name: str | None = None,
    ) -> None:
        """Set the numbers the next scrape exports (None: that source did not answer);
        ``model_name``: the served model's id (``--served-model-name``, as ``/v1/models``
        lists it), the ``vllm:`` gauges' ``model_name`` label that routers match."""
        self.engine_up = int(stats is not None)
        self.stats = stats or {}
        if model_name is not None:
            self.model_name = model_name
        self.ledger = ledger or []
        self.counters = counters or {}

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        yield GaugeMetricFamily("houchu_engine_up", "1 if the engine answered.", self.engine_up)
        for key, (name, doc) in ENGINE_GAUGES.items():
            v = self.stats.get(key)
            if isinstance(v, (int, float)):
                yield GaugeMetricFamily(name, doc, value=float(v))
        yield from self._vllm_named()
        yield from self._ledger()
        dropped = CounterMetricFamily(
            "houchu_telemetry_dropped_records",
            "Telemetry records dropped instead of slowing serving.",
            labels=["where"],
        )
        for where in ("actors", "recorder", "errors"):
            dropped.add_metric([where], float(self.counters.get(f"dropped_by_{where}", 0.0)))
        yield dropped
        yield CounterMetricFamily(
            "houchu_telemetry_written_records",
            "Telemetry records written to the database.",
            value=float(self.counters.get("records_written", 0.0)),
        )

    def _vllm_named(self) -> Iterable:
        """The engine numbers under the names that routers in front of vLLM scrape (the
        Gateway API Inference Extension, llm-d, vLLM's production-stack router), with
        vLLM's ``model_name`` label: requests running and waiting, the KV cache's usage
        (a fraction, 1 = every page held; also under vLLM's older name
        ``vllm:gpu_cache_usage_perc``, with ``vllm:gpu_prefix_cache_hit_rate``: smg's
        load poller reads those) and the prefix cache's queried and hit prompt
        tokens."""
        st = self.stats
        if not isinstance(st.get("num_running"), (int, float)):
            return
        labels, model = ["model_name"], [self.model_name or str(st.get("model", ""))]
        total = float(st.get("num_pages_total") or 0)
        usage = float(st.get("num_pages_used") or 0) / total if total else 0.0
        queried = float(st.get("prefix_tokens_queried") or 0)
        hit_rate = float(st.get("prefix_tokens_reused") or 0) / queried if queried else 0.0
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", st["num_running"]),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", st["num_waiting"]),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent usage.", usage),
            # vLLM's older names, which SGLang's Model Gateway (smg) reads for its load view
            ("vllm:gpu_cache_usage_perc", "KV-cache usage; 1 means 100 percent usage.", usage),
            (
                "vllm:gpu_prefix_cache_hit_rate",
                "Prefix-cache hit rate: prompt tokens found / looked up, since start.",
                hit_rate,
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(model, float(value))
            yield g
        for name, doc, key in (
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens queried in the prefix cache.",
                "prefix_tokens_queried",
            ),
            (
                "vllm:prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                "prefix_tokens_reused",
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(model, float(st.get(key) or 0))
            yield c

    def _ledger(self) -> Iterable:
        labels = ["lever", "verb", "unit"]
        saved = CounterMetricFamily(
            "houchu_lever_saved", "What each lever saved, in its unit.", labels=labels
        )
        spent = CounterMetricFamily(
            "houchu_lever_spent", "What each lever spent, in its unit.", labels=labels
        )
        samples = CounterMetricFamily(
            "houchu_lever_samples", "Ledger samples each lever reported.", labels=["lever", "verb"]
        )
        sums: dict[tuple[str, ...], float] = {}
        counts: dict[tuple[str, str], float] = {}
        for row in self.ledger:
            lv = (row["lever"], row["verb"])
            counts[lv] = counts.get(lv, 0) + row["samples"]
            for kind, total in (("saved", row["saved"]), ("spent", row["spent"])):
                unit = row[f"{kind}_unit"]
                if unit:
                    key = (kind, *lv, _unit(unit))
                    sums[key] = sums.get(key, 0.0) + total
        for (kind, *lbl), v in sorted(sums.items()):
            (saved if kind == "saved" else spent).add_metric(lbl, v)
        for lv, n in sorted(counts.items()):
            samples.add_metric(list(lv), n)
        yield from (saved, spent, samples)


METRICS_KEY: web.AppKey[GatewayMetrics] = web.AppKey("houchu_metrics", GatewayMetrics)
