"""Prompt log-probabilities (vLLM's ``prompt_logprobs``, and OpenAI's ``echo`` with
``logprobs``): each prompt token's log-probability given the tokens before it.

The logits at position ``p`` give the distribution of the token at ``p + 1``, so a
prefill chunk over positions ``s .. e - 1`` scores the prompt tokens ``s + 1 .. e``
(those below the prompt's length ``P``; the last prompt position's logits are the
sample row). The runner asks the model for the logits of those rows besides the sample
row (``rows_wanted``; they are trailing rows of the chunk, just before the sample row)
and turns them into ``PromptLogprobs`` (``score``) as vLLM does: ``log_softmax`` of the
raw logits, the prompt token's logprob and rank, and the top alternatives.

A request's state remembers how far its prompt was scored
(``RequestState.prompt_logprobs_done``), so a chunk recomputed after a preemption is not
scored twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from houchu.model.sampling.sampler import RequestState
from houchu.transport.messages import PromptLogprobs, SeqWork

#: Rows turned into log-probabilities at once (bounds the ``[rows, V]`` float32 copy).
ROWS_PER_PASS = 256


def rows_wanted(w: SeqWork, state: RequestState) -> tuple[int, int]:
    """(prompt rows of ``w`` to score, the position of the first): rows at positions
    ``p`` with ``prompt_logprobs_done <= p < P - 1`` (``P``: the prompt's length), for
    a request that asked for prompt logprobs; (0, 0) for any other, and for a work item
    that verifies proposals."""
    if state.params.prompt_logprobs is None or w.num_draft:
        return 0, 0
    start = w.start_pos
    lo = max(start, state.prompt_logprobs_done)
    hi = min(start + len(w.token_ids), len(state.prompt_ids) - 1)
    return max(hi - lo, 0), lo


def score(
    logits: torch.Tensor,
    spans: Sequence[tuple[int, int, int]],
    states: Sequence[RequestState],
) -> list[PromptLogprobs]:
    """Score prompt tokens.

    Args:
        logits: ``[R, V]`` float32 raw logits of the step's wanted rows.
        spans: per scored request, ``(first row in logits, rows, first position)``.
        states: the request of each span (its ``prompt_ids`` and
            ``params.prompt_logprobs`` alternatives); their ``prompt_logprobs_done`` is
            advanced past the scored positions.
    Returns:
        One ``PromptLogprobs`` per span (the tokens at positions ``first + 1 ..``).
    """
    if not spans:
        return []
    dev = logits.device
    rows = torch.cat([torch.arange(r, r + n, device=dev) for r, n, _ in spans])  # [Rp]
    targets = torch.tensor(  # [Rp] the prompt token each row predicts
        [
            t
            for (_, n, p), st in zip(spans, states, strict=True)
            for t in st.prompt_ids[p + 1 : p + 1 + n]
        ],
        device=dev,
    )
    k = max(st.params.prompt_logprobs or 0 for st in states)
    chosen, ranks, top_v, top_i = [], [], [], []
    for a in range(0, rows.numel(), ROWS_PER_PASS):
        lp = torch.log_softmax(logits.index_select(0, rows[a : a + ROWS_PER_PASS]), dim=-1)
        t = targets[a : a + ROWS_PER_PASS]
        c = lp.gather(1, t[:, None])  # [r, 1]
        chosen.append(c[:, 0])
        ranks.append((lp > c).sum(dim=-1) + 1)  # [r] int64, 1 = most likely
        if k:
            v, i = lp.topk(k, dim=-1)  # [r, k]
            top_v.append(v)
            top_i.append(i)
    lps = torch.cat(chosen).tolist()
    rk = torch.cat(ranks).tolist()
    tv = torch.cat(top_v).tolist() if k else [[] for _ in lps]
    ti = torch.cat(top_i).tolist() if k else [[] for _ in lps]
    out, a = [], 0
    for (_, n, p), st in zip(spans, states, strict=True):
        kk = st.params.prompt_logprobs or 0
        top = [
            sorted(zip(ti[j][:kk], tv[j][:kk], strict=True), key=lambda x: (-x[1], x[0]))
            for j in range(a, a + n)
        ]
        out.append(
            PromptLogprobs(
                rid=st.rid, start=p + 1, logprobs=lps[a : a + n], ranks=rk[a : a + n], top=top
            )
        )
        st.prompt_logprobs_done = p + n
        a += n
    return out
