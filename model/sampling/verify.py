"""Speculative verification: which proposed tokens the target model accepts.

A verified request's work holds its last real token followed by ``k`` proposals
``d_1 .. d_k``; one forward pass gives the target's logits at all ``k + 1`` positions:
row ``j`` is the distribution ``p_j`` of the token after ``d_j`` (``d_0``: the last real
token), so ``p_j`` judges ``d_{j+1}`` and ``p_k`` yields one more token if all pass.

The acceptance rule is speculative sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating
Large Language Model Decoding with Speculative Sampling", Algorithm 2): for ``j = 0, 1,
..``, accept ``d_{j+1}`` with probability ``min(1, p_j(d) / q_j(d))``; on rejection emit
a token from the residual ``norm(max(0, p_j - q_j))`` and stop; after ``k`` acceptances
emit a token from ``p_k``. The output is distributed exactly as the target's.

houchu's drafts send token ids, not distributions (bulk data does not travel between
actors), so ``q_j`` is the point mass on ``d_{j+1}``: acceptance probability is
``p_j(d)``, and the residual is ``p_j`` with ``d`` removed and renormalised. This rule is
realised by a coupling: draw ``t_j ~ p_j`` exactly as the plain sampler would (same
penalties, temperature, filters, and the request's own seeded generator), accept
``d_{j+1}`` iff ``t_j == d_{j+1}``, else emit ``t_j``. Then ``P(accept) = p_j(d)`` and,
given rejection, ``t_j`` is distributed as ``p_j`` conditioned on ``t_j != d`` — the
residual. Every emitted token consumes one draw in order, as without speculation, so a
seeded request emits the same tokens with and without speculation, and a greedy request
accepts exactly the target's argmax tokens. Penalties see the accepted proposals: row
``j + 1`` is processed after ``d_{j+1}`` joined the request's history.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from houchu.model.sampling.sampler import RequestState, Sample, Sampler


def sample_and_verify(
    sampler: Sampler,
    logits: torch.Tensor,
    counts: Sequence[int],
    states: Sequence[RequestState],
    drafts: Sequence[Sequence[int]],
    masks: Sequence[torch.Tensor | None] | None = None,
) -> list[list[Sample]]:
    """Sample every sampled request's next token(s), verifying proposals where there are.

    Works in waves: wave ``j`` samples row ``j`` of every request still accepting, all in
    one ``Sampler.sample`` call; a request leaves the waves at its first mismatch or after
    its last row. Each emitted token is appended to its request's state (penalties).

    Args:
        sampler: the runner's sampler.
        logits: ``[R, V]`` float32 raw logits, requests' rows consecutive, in order.
        counts: rows per request (``len(drafts[i]) + 1``); ``sum(counts) == R``.
        states: each request's sampling state.
        drafts: each request's proposals (empty: an ordinary one-token sample).
        masks: per logits row, the tokens its grammar allows (``[V]`` bool) or None
            (``houchu.model.grammar.matcher``): a proposal outside it is never accepted.
    Returns:
        Per request, the emitted tokens in order: the accepted proposals, then the target's
        own token (1 .. ``len(drafts[i]) + 1`` of them).
    Raises:
        ValueError: ``counts`` disagree with ``drafts`` or with the number of rows.
    """
    if len(counts) != len(states) or len(drafts) != len(states):
        raise ValueError("counts, states and drafts must have one entry per request")
    if sum(counts) != logits.shape[0]:
        raise ValueError(f"{sum(counts)} rows expected, logits have {logits.shape[0]}")
    offsets, row = [], 0
    for i, c in enumerate(counts):
        if c != len(drafts[i]) + 1:
            raise ValueError(f"request {i}: {c} rows for {len(drafts[i])} proposals")
        offsets.append(row)
        row += c
    out: list[list[Sample]] = [[] for _ in states]
    active, j = list(range(len(states))), 0
    while active:
        rows = [offsets[i] + j for i in active]
        if rows == list(range(logits.shape[0])):  # every row, in order: no copy
            wave = logits
        else:
            wave = logits.index_select(0, torch.tensor(rows, device=logits.device))
        wave_masks = None if masks is None else [masks[r] for r in rows]
        samples = sampler.sample(wave, [states[i] for i in active], wave_masks)
        still = []
        for i, s in zip(active, samples, strict=True):
            states[i].append(s.token_id)
            out[i].append(s)
            if j < len(drafts[i]) and s.token_id == drafts[i][j]:
                still.append(i)
        active, j = still, j + 1
    return out
