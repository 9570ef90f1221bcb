"""Per-request timings and the summary metrics, named as in vLLM's and SGLang's serving
benchmarks.

- **TTFT** (time to first token): from sending a request to the first chunk that
  carries output tokens.
- **TPOT** (time per output token): ``(E2E - TTFT) / (output tokens - 1)``, per request,
  for requests with more than one output token.
- **ITL** (inter-token latency): the gaps between consecutive token-carrying chunks,
  pooled over all requests (a chunk holding several tokens is one gap, as in vLLM).
- **E2E** (end-to-end latency, ``e2el``): from sending to the last byte of the answer.
- Throughputs divide by the benchmark's duration (first send to last completion).
- **Goodput**: completed requests per second that met every given objective
  (TTFT / TPOT / E2E, in milliseconds).

Latencies are reported in milliseconds, throughputs per second.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p90", "p99")


@dataclass
class RequestResult:
    """What happened to one request (times from ``time.perf_counter``, seconds).

    Attributes:
        tag: the workload's class label of the request.
        start: when it was sent.
        end: when its answer ended (or it failed).
        token_times: arrival time of each chunk that carried output tokens.
        output_tokens: output tokens: the server's ``usage.completion_tokens`` when
            reported (``usage_reported``), else the tokens counted in the chunks.
        input_tokens: the server's ``usage.prompt_tokens``, else None.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` when reported.
        counted_tokens: output tokens counted from the stream itself (token ids, or
            one per content chunk when the server does not send ids).
        error: None on success, else a kind: ``timeout``, ``http_<status>``,
            ``server_error``, ``connection`` or ``protocol``.
        error_message: details of the error.
        text: the generated text (multi-turn sessions resend it).
    """

    tag: str
    start: float
    end: float = 0.0
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    input_tokens: int | None = None
    cached_tokens: int | None = None
    counted_tokens: int = 0
    usage_reported: bool = False
    error: str | None = None
    error_message: str = ""
    text: str = ""

    @property
    def ok(self) -> bool:
        """Whether the request completed without error."""
        return self.error is None

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds, or None without output."""
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2el(self) -> float:
        """End-to-end latency in seconds."""
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, in seconds; None for <= 1 token."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2el - ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive token-carrying chunks, in seconds."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def to_json(self) -> dict[str, Any]:
        """The per-request record saved with the results (times relative, seconds)."""
        return {
            "tag": self.tag,
            "ok": self.ok,
            "error": self.error,
            "error_message": self.error_message[:500],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "counted_tokens": self.counted_tokens,
            "cached_tokens": self.cached_tokens,
            "usage_reported": self.usage_reported,
            "ttft_s": self.ttft,
            "tpot_s": self.tpot,
            "e2el_s": self.e2el,
            "itl_s": self.itls,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100, linear interpolation as numpy), None if empty."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, p90 and p99 of ``values`` (seconds) in milliseconds."""
    if not values:
        return dict.fromkeys(STATS)
    ms = [v * 1000.0 for v in values]
    return {
        "mean": float(np.mean(ms)),
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def meets_slo(r: RequestResult, slo_ms: dict[str, float]) -> bool:
    """Whether a completed request met every objective in ``slo_ms`` (milliseconds).

    Keys: ``ttft``, ``tpot``, ``e2el``. A request with one output token has no TPOT and
    meets a TPOT objective.
    """
    if not r.ok:
        return False
    values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
    for key, limit in slo_ms.items():
        v = values[key]
        if v is None or v * 1000.0 > limit:
            return False
    return True


def summarize(
    results: Iterable[RequestResult],
    duration_s: float,
    slo_ms: dict[str, float] | None = None,
    incomplete: int = 0,
) -> dict[str, Any]:
    """The benchmark's metrics over ``results``.

    Args:
        results: the measured requests (warm-up excluded).
        duration_s: seconds from the first send to the last completion.
        slo_ms: goodput objectives in milliseconds (``ttft``/``tpot``/``e2el``), or None.
        incomplete: requests cancelled at the time limit (not counted as errors).

    Returns:
        Flat vLLM-style keys: ``completed``, ``failed``, ``duration_s``,
        ``request_throughput`` (req/s), ``output_throughput`` (tok/s), ...,
        ``mean_ttft_ms``, ``median_ttft_ms``, ``p90_ttft_ms``, ``p99_ttft_ms``, and so on.
    """
    rs = list(results)
    ok = [r for r in rs if r.ok]
    dur = max(duration_s, 1e-9)
    n_in = sum(r.input_tokens or 0 for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(rs) - len(ok),
        "incomplete": incomplete,
        "errors": dict(Counter(r.error for r in rs if r.error)),
        "duration_s": duration_s,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "usage_missing": sum(1 for r in ok if not r.usage_reported),
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "request_throughput": len(ok) / dur,
        "input_throughput": n_in / dur,
        "output_throughput": n_out / dur,
        "total_token_throughput": (n_in + n_out) / dur,
        "request_goodput": None,
        "slo_ms": dict(slo_ms or {}),
    }
    if slo_ms:
        out["request_goodput"] = sum(1 for r in ok if meets_slo(r, slo_ms)) / dur
    series = {
        "ttft": [t for r in ok if (t := r.ttft) is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [g for r in ok for g in r.itls],
        "e2el": [r.e2el for r in ok],
    }
    for name in LATENCIES:
        for stat, v in stats_ms(series[name]).items():
            out[f"{stat}_{name}_ms"] = v
    return out


def parse_slo(items: Sequence[str]) -> dict[str, float]:
    """Parse ``--goodput ttft:500 tpot:50`` into ``{"ttft": 500.0, "tpot": 50.0}`` (ms).

    Raises:
        ValueError: an unknown metric or a non-positive limit.
    """
    out: dict[str, float] = {}
    for item in items:
        key, _, val = item.partition(":")
        if key not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"goodput objective {item!r}: metric must be ttft, tpot or e2el")
        try:
            limit = float(val)
        except ValueError:
            raise ValueError(f"goodput objective {item!r}: expected METRIC:MILLISECONDS") from None
        if limit <= 0:
            raise ValueError(f"goodput objective {item!r}: the limit must be positive")
        out[key] = limit
    return out
