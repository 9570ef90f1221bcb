"""The sampling warpers (top-k, top-p, min-p) and the draw of one token per row.

Each works on a batch of rows, ``[R, V]`` float32 logits or probabilities. Over a
vocabulary of tens of thousands of tokens the textbook forms are slow on a CPU: a full
sort per row for top-p (~2 ms a row at V = 49,152) and ``torch.multinomial`` (~1 ms a
row), more than a batch-32 decode step costs. So:

- ``apply_top_p`` looks for the nucleus among the 1,024 most likely tokens first (one
  ``topk``), then the 8,192 most likely (``TOP_P_CANDIDATES``), and sorts only those; a
  row whose nucleus is not decided there (its candidates hold less than ``p``, or a tie
  sits on the boundary) takes the full sort. The result is the full sort's, as a unit
  test checks against it.
- ``draw_rows`` draws by inversion: one uniform per row from the row's generator and a
  binary search in the row's cumulative distribution (float64), exact for any
  distribution, with one random number per draw instead of a pass of the multinomial
  sampler over the whole row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: How many of the most likely tokens ``apply_top_p`` looks for the nucleus among, in
#: turn, before it sorts a whole row.
TOP_P_CANDIDATES = (1024, 8192)


def apply_top_k(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep each row's ``k`` largest logits (ties at the k-th value are kept).

    Args:
        logits: ``[R, V]`` float32.
        k: ``[R]`` int64; ``k <= 0`` or ``k >= V`` leaves the row unchanged.
    Returns:
        ``[R, V]`` with the rest set to -inf.
    """
    v = logits.shape[-1]
    on = (k > 0) & (k < v)  # [R]
    if not bool(on.any()):
        return logits
    kmax = int(k[on].max())
    top = logits.topk(kmax, dim=-1).values  # [R, kmax]
    kk = k.clamp(1, kmax) - 1
    thresh = top.gather(1, kk[:, None])  # [R, 1]
    thresh = torch.where(on[:, None], thresh, torch.full_like(thresh, float("-inf")))
    return logits.masked_fill(logits < thresh, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2019): keep the smallest set of most likely tokens
    whose probability mass reaches ``p`` (a token is dropped when the tokens above it
    already hold >= p; equal logits are ordered by token id).

    Args:
        logits: ``[R, V]`` float32.
        p: ``[R]`` float32 in (0, 1]; 1 leaves the row unchanged.
    Returns:
        ``[R, V]`` with dropped tokens at -inf (the most likely token always stays).
    """
    on = p < 1.0  # [R]
    if not bool(on.any()):
        return logits
    drop = torch.zeros_like(logits, dtype=torch.bool)  # [R, V]
    rows = on.nonzero()[:, 0]  # rows still to decide among candidates
    sort = rows[:0]  # rows left to the full sort
    sizes = [k for k in TOP_P_CANDIDATES if k < logits.shape[1]]
    for i, k in enumerate(sizes):
        if rows.numel() == 0:
            break
        nxt = sizes[i + 1] if i + 1 < len(sizes) else logits.shape[1]
        row_drop, decided, reach = _top_p_drop_candidates(logits[rows], p[rows], k, nxt)
        drop[rows[decided]] = row_drop[decided]
        hopeless = ~decided & (reach < p[rows].double())  # the next size cannot hold p
        sort = torch.cat([sort, rows[hopeless]])
        rows = rows[~decided & ~hopeless]
    sort = torch.cat([sort, rows])
    if sort.numel():
        drop[sort] = _top_p_drop_sorted(logits[sort], p[sort])
    return logits.masked_fill(drop, float("-inf"))


def _top_p_drop_candidates(
    logits: torch.Tensor, p: torch.Tensor, k: int, nxt: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``apply_top_p``'s dropped tokens (``[R, V]`` bool) found among each row's ``k`` most
    likely tokens; which rows that decides (``[R]`` bool): those whose nucleus ends inside
    the candidates, above the smallest of them (a token left out of the ``k`` ties with
    that one at most, so the candidates before it are the full order's first); and the
    most mass each row's ``nxt`` most likely tokens can hold (``[R]`` float64: the
    candidates' mass plus ``nxt - k`` tokens as likely as the smallest of them)."""
    top_v, top_i = logits.topk(k, dim=-1)  # [R, k], the k largest (ties in any order)
    by_id, perm = top_i.sort(dim=-1)  # [R, k]: the candidates by token id, then ...
    cand_v, perm2 = top_v.gather(1, perm).sort(dim=-1, descending=True, stable=True)
    cand_i = by_id.gather(1, perm2)  # [R, k]: ... by logit, ties by token id
    probs = _probs64(cand_v, logits)  # [R, k]
    before = probs.cumsum(dim=-1) - probs  # [R, k]: the mass of the tokens above each
    over = before >= p[:, None]  # [R, k]
    over[:, 0] = False  # the most likely token stays, however small p is
    found = over.any(dim=-1)  # [R]
    j = over.int().argmax(dim=-1)  # [R]: the first dropped candidate (where found)
    last_kept = cand_v.gather(1, (j - 1).clamp(min=0)[:, None])[:, 0]  # [R]
    decided = found & (last_kept > cand_v[:, -1])  # [R]
    keep = torch.arange(k, device=logits.device)[None, :] < j[:, None]  # [R, k]
    drop = torch.ones_like(logits, dtype=torch.bool).scatter_(1, cand_i, ~keep)  # [R, V]
    reach = before[:, -1] + probs[:, -1] * (nxt - k + 1)  # [R]
    return drop, decided, reach


def _top_p_drop_sorted(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``apply_top_p``'s dropped tokens by a full sort of each row: ``[R, V]`` bool."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [R, V]
    probs = _probs64(sorted_logits, logits)  # [R, V]
    mass_before = probs.cumsum(dim=-1) - probs  # [R, V]
    drop_sorted = (mass_before >= p[:, None]) & (p[:, None] < 1.0)
    drop_sorted[:, 0] = False  # the most likely token stays, however small p is
    return torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)


def _probs64(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``values`` (``[R, n]``, some of each row's logits) as probabilities of the whole
    row of ``logits`` (``[R, V]``), float64: each is ``exp(value - logsumexp(row))``, so
    the candidates' running sums equal the full sort's prefix by prefix."""
    return (values.double() - logits.double().logsumexp(dim=-1, keepdim=True)).exp()


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Min-p filter (Nguyen et al. 2024): drop tokens whose probability is below
    ``min_p`` × the row's largest.

    Args:
        logits: ``[R, V]`` float32.
        min_p: ``[R]`` float32 in [0, 1]; 0 leaves the row unchanged.
    Returns:
        ``[R, V]`` with dropped tokens at -inf.
    """
    if not bool((min_p > 0).any()):
        return logits
    probs = logits.softmax(dim=-1)  # [R, V]
    thresh = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
    return logits.masked_fill(probs < thresh, float("-inf"))


def draw_rows(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None], shared: torch.Generator
) -> torch.Tensor:
    """One token per row, drawn with probability ``probs[r, t] / probs[r].sum()``, by
    inversion: ``u ~ U[0, 1)`` from the row's generator (or ``shared`` where it is
    None), then the first token whose cumulative probability exceeds ``u`` × the row's
    total. A token of probability 0 is never drawn.

    Args:
        probs: ``[R, V]`` float32, non-negative, each row with a positive sum.
        generators: R generators (None: ``shared``), each advanced by one number.
        shared: the generator of the rows without their own.
    Returns:
        ``[R]`` int64 token ids.
    """
    dev = probs.device
    u = torch.cat(
        [torch.rand(1, generator=g or shared, device=dev, dtype=torch.float64) for g in generators]
    )  # [R]
    cdf = probs.to(torch.float64).cumsum(dim=-1)  # [R, V]
    total = cdf[:, -1]  # [R]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # [R] < total
    return torch.searchsorted(cdf, x[:, None], right=True)[:, 0]
