"""Structured output through a ModelRunner: the default model's vocabulary size, a batch of
requests run to their EOS (prefill, then decodes with forced tokens and drafts), and a
work item."""

from __future__ import annotations

from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

VOCAB = 49152


def run(
    runner: ModelRunner,
    requests: dict[str, tuple[list[int], SamplingParams]],
    steps: int,
    drafts: dict[str, list[int]] | None = None,
) -> dict[str, list[int]]:
    """Prefill then decode every request for ``steps`` steps in one batch (stopping a
    request at its EOS); ``drafts`` gives proposals to verify at the first decode step.
    Each step feeds a request's tokens not computed yet: the last one sampled, and the
    ones its grammar forced after it (jump-forward)."""
    pages = {rid: list(range(i * 16, (i + 1) * 16)) for i, rid in enumerate(requests)}
    init = [SeqInit(rid=r, sampling=sp, prompt_ids=p) for r, (p, sp) in requests.items()]
    work = [work_item(r, p, 0, pages[r]) for r, (p, _) in requests.items()]
    out: dict[str, list[int]] = {r: [] for r in requests}
    done = {r: len(p) for r, (p, _) in requests.items()}  # positions computed
    res = runner.execute(StepPlan(step_id=0, init=init, work=work))
    for step in range(1, steps):
        for o in res.outputs:
            out[o.rid].append(o.token_id)
        live = [r for r in requests if not out[r] or out[r][-1] != 2]
        if not live:
            break
        work = []
        for r in live:
            d = (drafts or {}).get(r, []) if step == 1 else []
            ids = requests[r][0] + out[r]
            work.append(work_item(r, [*ids[done[r] :], *d], done[r], pages[r], num_draft=len(d)))
            done[r] = len(ids)
        res = runner.execute(StepPlan(step_id=step, work=work))
    runner.execute(StepPlan(step_id=steps, work=[], release=list(requests)))
    return out


def work_item(
    rid: str, ids: list[int], start: int, pages: list[int], num_draft: int = 0
) -> SeqWork:
    return SeqWork(
        rid=rid, token_ids=ids, start_pos=start, page_table=pages, sample=True, num_draft=num_draft
    )
