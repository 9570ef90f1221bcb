"""Greedy generation through a ModelRunner for the runner tests."""

from __future__ import annotations

from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

GREEDY = SamplingParams(temperature=0.0)


def generate(runner: ModelRunner, n: int = 12) -> dict[str, list[int]]:
    """Three sequences prefilled together, then decoded together for n steps."""
    prompts = {"a": [1, 5, 9, 33, 70, 2, 8], "b": [7, 7, 100], "c": [3]}
    tables = {r: list(range(i * 6, i * 6 + 6)) for i, r in enumerate(prompts)}
    init = [SeqInit(rid=r, sampling=GREEDY, prompt_ids=p) for r, p in prompts.items()]
    work = [
        SeqWork(rid=r, token_ids=p, start_pos=0, page_table=tables[r], sample=True)
        for r, p in prompts.items()
    ]
    out = {
        o.rid: [o.token_id]
        for o in runner.execute(StepPlan(step_id=0, init=init, work=work)).outputs
    }
    for s in range(n - 1):
        work = [
            SeqWork(
                rid=r,
                token_ids=[out[r][-1]],
                start_pos=len(p) + s,
                page_table=tables[r],
                sample=True,
            )
            for r, p in prompts.items()
        ]
        for o in runner.execute(StepPlan(step_id=s + 1, work=work)).outputs:
            out[o.rid].append(o.token_id)
    return out
