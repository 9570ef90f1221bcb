"""Start-up calibration of the cost model: time target passes of 1, 2, 4, ... tokens.

Each pass is one dummy sequence of ``T`` tokens at positions ``0 .. T - 1`` with logits
wanted at every position (``T - 1`` proposals to verify), so it costs what a decode or
verification step of ``T`` tokens costs: the matmuls and the LM head over ``T`` rows
(attention over a short context, which is a small share at these sizes). The sizes run
in several rounds; the fastest warm timing of each is kept.
"""

from __future__ import annotations

from houchu.transport.messages import Phase, SamplingParams, SeqInit, SeqWork, StepPlan

CALIBRATION_RID = "__houchu_spec_calibration__"


def calibration_sizes(max_tokens: int, limit: int = 128) -> list[int]:
    """Powers of two from 1 up to ``min(max_tokens, limit)``."""
    top, out, t = min(max_tokens, limit), [], 1
    while t <= top:
        out.append(t)
        t *= 2
    return out


def calibration_plans(sizes: list[int], pages: list[int], repeats: int = 3) -> list[StepPlan]:
    """The plans to time, ``repeats`` rounds of ``sizes``: the first registers the dummy
    request, an extra last one (no work) releases it. ``pages`` must hold ``max(sizes)``
    positions. Step ids are negative, apart from the scheduler's own."""
    plans, step = [], -1
    for _ in range(repeats):
        for t in sizes:
            work = SeqWork(
                rid=CALIBRATION_RID,
                token_ids=[0] * t,
                start_pos=0,
                page_table=pages,
                sample=True,
                num_draft=t - 1,
                phase=Phase.DECODE,  # a verify pass of t - 1 proposals
            )
            plans.append(StepPlan(step_id=step, work=[work]))
            step -= 1
    greedy = SamplingParams(temperature=0.0, max_tokens=1 << 30)
    plans[0].init = [SeqInit(rid=CALIBRATION_RID, sampling=greedy, prompt_ids=[])]
    plans.append(StepPlan(step_id=step, work=[], release=[CALIBRATION_RID]))
    return plans


def best_times(sizes: list[int], seconds: list[float]) -> dict[int, float]:
    """Per size, the fastest of its timings after the first (warm-up) round: the machine
    is shared, and interference only ever adds time. ``seconds`` are the work plans'
    durations in plan order."""
    rounds = [seconds[i : i + len(sizes)] for i in range(0, len(seconds), len(sizes))]
    warm = rounds[1:] or rounds
    return {t: min(r[j] for r in warm) for j, t in enumerate(sizes)}
