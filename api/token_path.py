"""Where one generated token's time goes: the per-token breakdown of ``/stats``'s
``token_path`` section and of ``python -m houchu.bench.served.token_path``.

Each ``TextDelta`` carries the ``StepStamps`` of the step that released it
(``houchu.transport.token_path``); the engine client adds when the delta reached the
gateway and when the client's write of it returned. Two consecutive deltas of a request
from consecutive steps N and N+1 make one sample (``breakdown``), in milliseconds:

The cycle: from the end of step N to the end of step N+1 on the runner. Its components
sum to it exactly; in steady state its mean is the mean inter-token latency (ITL), and
each component's share of ITL is its mean over the mean ITL:

- ``forward``, ``sampling``, ``step_other``: step N+1 itself on the runner: the model's
  forward passes, sampling, and the rest of ``ModelRunner.execute`` (validating the
  plan, the batch's tensors, the outputs);
- ``runner_out``: step N's end until its result is handed to the runner's outbox (the
  worker thread's hand-back to the event loop, the step record);
- ``hop_runner_scheduler``: result handed over until the scheduler took it (ZeroMQ, the
  decoding, the scheduler's loop waking);
- ``scheduler_apply``: applying step N's result and handing its tokens over;
- ``scheduler_plan``: planning step N+1 and handing its plan over;
- ``hop_scheduler_runner``: plan handed over until the runner took it;
- ``runner_in``: plan taken until the runner began executing it.

A step planned while the previous one still ran (the overlap scheduler) puts the
scheduler off the cycle: its hop and its parts are then 0, ``runner_out`` is step N's end
until its result left (or the next plan was taken, if that came first) and
``hop_scheduler_runner`` the runner's loop from there until it took the plan that was
waiting. A plan the runner took before step N ended (queued behind it) makes the whole
gap ``runner_in``: the worker thread going from one step to the next.

Delivery, after step N+1 ends, beside the next step (it adds to every token's latency,
not to the gaps between tokens, but its processes take CPU from the step): after the
cycle's ``runner_out``, ``hop_runner_scheduler`` and ``scheduler_apply`` of step N+1,
``hop_scheduler_tokenizer``, ``detokenize`` (the step's events up to this delta),
``hop_tokenizer_gateway``, and ``gateway_write`` (the delta taken from the engine
client's queue, turned into a frame and written to the client's socket).

Totals: ``cycle`` (the sum above), ``itl`` (the gap between the two writes at the
gateway) and ``latency`` (step N+1's end until its write returned).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable

import numpy as np

from houchu.transport.token_path import StepStamps

#: The cycle's components, in the order the table prints them: name -> what it is.
CYCLE = {
    "forward": "model forward (runner)",
    "sampling": "sampling (runner)",
    "step_other": "rest of the runner's step",
    "runner_out": "runner: step end -> result sent",
    "hop_runner_scheduler": "hop runner -> scheduler",
    "scheduler_apply": "scheduler: apply result, send tokens",
    "scheduler_plan": "scheduler: plan, send next step",
    "hop_scheduler_runner": "hop scheduler -> runner",
    "runner_in": "runner: plan taken -> step start",
}
#: The delivery's components (beside the next step): name -> what it is.
DELIVERY = {
    "hop_scheduler_tokenizer": "hop scheduler -> tokenizer",
    "detokenize": "detokenize, stop strings (tokenizer)",
    "hop_tokenizer_gateway": "hop tokenizer -> gateway",
    "gateway_write": "gateway: frame and write to client",
}
#: The totals: name -> what it is.
TOTALS = {
    "cycle": "cycle: step end -> next step end",
    "itl": "ITL at the gateway (write -> write)",
    "latency": "latency: step end -> written",
}
#: Every field of a sample, in order.
FIELDS = (*CYCLE, *DELIVERY, *TOTALS)
#: Samples ``TokenPathStats`` keeps (the latest ones).
WINDOW = 4096


def breakdown(prev: StepStamps, cur: StepStamps) -> dict[str, float] | None:
    """One token's sample from the stamps of a request's delta of step N (``prev``) and
    its next delta, of step N+1 (``cur``), both written: seconds per field of
    ``FIELDS`` (module docstring). None when ``cur`` is not the step after ``prev`` or a
    stamp is missing (0.0)."""
    if cur.step_id != prev.step_id + 1:
        return None
    needed = (
        prev.step_started,
        prev.result_sent,
        prev.result_received,
        prev.tokens_sent,
        prev.written,
        cur.plan_sent,
        cur.plan_received,
        cur.step_started,
        cur.tokens_sent,
        cur.tokenizer_received,
        cur.tokenizer_sent,
        cur.gateway_received,
        cur.written,
    )
    if not all(needed):
        return None
    out = dict.fromkeys(FIELDS, 0.0)
    out["forward"] = cur.forward_s
    out["sampling"] = cur.sample_s
    out["step_other"] = cur.step_s - cur.forward_s - cur.sample_s
    if cur.plan_received <= prev.step_end:  # the plan waited at the runner: its gap alone
        out["runner_in"] = cur.step_started - prev.step_end
    elif cur.plan_sent < prev.result_received:  # planned ahead: the scheduler is off it
        out["runner_out"] = min(prev.result_sent, cur.plan_received) - prev.step_end
        out["hop_scheduler_runner"] = max(cur.plan_received - prev.result_sent, 0.0)
        out["runner_in"] = cur.step_started - cur.plan_received
    else:
        out["runner_out"] = prev.result_sent - prev.step_end
        out["hop_runner_scheduler"] = prev.result_received - prev.result_sent
        out["scheduler_apply"] = prev.tokens_sent - prev.result_received
        out["scheduler_plan"] = cur.plan_sent - prev.tokens_sent
        out["hop_scheduler_runner"] = cur.plan_received - cur.plan_sent
        out["runner_in"] = cur.step_started - cur.plan_received
    out["hop_scheduler_tokenizer"] = cur.tokenizer_received - cur.tokens_sent
    out["detokenize"] = cur.tokenizer_sent - cur.tokenizer_received
    out["hop_tokenizer_gateway"] = cur.gateway_received - cur.tokenizer_sent
    out["gateway_write"] = cur.written - cur.gateway_received
    out["cycle"] = cur.step_end - prev.step_end
    out["itl"] = cur.written - prev.written
    out["latency"] = cur.written - cur.step_end
    return out


def summarize(samples: Iterable[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per field of ``FIELDS``: ``mean_ms``, ``p50_ms``, ``p90_ms`` (milliseconds) and
    ``share`` (its mean over the mean ITL; 0 without samples) over ``samples`` (each
    ``breakdown``'s seconds). Empty without samples."""
    rows = list(samples)
    if not rows:
        return {}
    itl = statistics.fmean(r["itl"] for r in rows)
    out: dict[str, dict[str, float]] = {}
    for name in FIELDS:
        values = [r[name] * 1e3 for r in rows]
        mean = statistics.fmean(values)
        out[name] = {
            "mean_ms": mean,
            "p50_ms": float(np.percentile(values, 50)),
            "p90_ms": float(np.percentile(values, 90)),
            "share": mean / (itl * 1e3) if itl > 0 else 0.0,
        }
    return out


class TokenPathStats:
    """The gateway's per-token breakdowns: the latest ``window`` samples, numbered.

    ``written(rid, stamps)`` is called once a delta of ``rid`` was written to its client
    (``stamps.written`` set); it pairs the delta with the request's previous one.
    ``forget(rid)`` when the request is over.
    """

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[tuple[int, dict[str, float]]] = deque(maxlen=window)
        self._last: dict[str, StepStamps] = {}
        self.num_samples = 0  # samples taken since start (the latest's number)
        self.num_unpaired = 0  # deltas after the first of a request that made no sample

    def written(self, rid: str, stamps: StepStamps) -> None:
        """A delta of ``rid`` with ``stamps`` was written to its client."""
        prev = self._last.get(rid)
        self._last[rid] = stamps
        if prev is None:
            return
        sample = breakdown(prev, stamps)
        if sample is None:
            self.num_unpaired += 1
            return
        self.num_samples += 1
        self._samples.append((self.num_samples, sample))

    def forget(self, rid: str) -> None:
        """``rid`` is over: its last delta pairs with nothing any more."""
        self._last.pop(rid, None)

    def stats(self, since: int = 0) -> dict[str, object]:
        """``/stats``'s ``token_path``: ``samples`` (how many of the kept samples are
        summarized: those numbered above ``since``), ``last_sample`` (the latest's
        number: pass it as ``since`` to summarize only what comes after),
        ``unpaired`` and ``components`` (``summarize``, milliseconds)."""
        rows = [s for n, s in self._samples if n > since]
        return {
            "samples": len(rows),
            "last_sample": self.num_samples,
            "unpaired": self.num_unpaired,
            "components": summarize(rows),
        }


def format_table(components: dict[str, dict[str, float]]) -> str:
    """``components`` (``summarize``'s) as a text table: a row per field with its mean,
    p50 and p90 in milliseconds and its share of the mean ITL, in three groups (the
    cycle, the delivery beside the next step, the totals)."""
    head = f"{'component':<40}{'mean ms':>9}{'p50 ms':>9}{'p90 ms':>9}{'of ITL':>8}"
    lines = [head, "-" * len(head)]
    groups = (("cycle", CYCLE), ("delivery, beside the next step", DELIVERY), ("", TOTALS))
    for title, names in groups:
        if title:
            lines.append(f"[{title}]")
        for name, label in names.items():
            r = components.get(name)
            if r is None:
                continue
            lines.append(
                f"{label:<40}{r['mean_ms']:>9.3f}{r['p50_ms']:>9.3f}{r['p90_ms']:>9.3f}"
                f"{r['share']:>8.1%}"
            )
    return "\n".join(lines)
