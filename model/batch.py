"""One forward pass's input: the tokens of several sequences, flattened, with the
metadata paged attention needs. Built from the scheduler's ``SeqWork`` list and validated
here, so a bad plan raises ``ValueError`` before any KV is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from houchu.transport.messages import SeqWork


@dataclass
class StepBatch:
    """A flattened batch of S sequences with T new tokens in total.

    Tensors (all on the model device):
        token_ids: ``[T]`` int64, the new tokens, sequence after sequence.
        positions: ``[T]`` int64, each token's position in its sequence.
        slot_mapping: ``[T]`` int64, KV-pool slot (page * page_size + offset) each new
            token's K/V is written to.
        page_tables: ``[S, max_pages]`` int64, each sequence's pages, padded with 0.
        sample_rows: ``[R]`` int64, rows of T whose logits are wanted (the last new token
            of every sequence with ``sample``; the last ``num_draft + 1`` of a sequence
            whose proposals are verified), in sequence order.
    Python metadata (length S unless noted):
        q_starts: ``S + 1`` offsets of each sequence's first new token in T.
        start_pos: position of each sequence's first new token.
        kv_lens: tokens of KV each sequence attends over (start_pos + n_new).
        sampled: indices (into 0..S-1) of the sequences that sample.
        page_size: tokens per page.
        sample_counts: rows of ``sample_rows`` per sampled sequence (1, or
            ``num_draft + 1``), parallel to ``sampled``; R is their sum.
        prompt_spans: per sequence whose prompt rows are scored
            (``houchu.model.sampling.prompt_logprobs``): (sequence index, first row of them in
            ``sample_rows``, rows); those rows come just before the sequence's sample row.
        sample_select: ``[R_sampled]`` int64, the rows of ``sample_rows`` that sample,
            in order (None: all of them, when no prompt rows are scored).
        prompt_seqs: indices of the sequences whose new tokens are all prompt tokens (a
            prefill chunk, or the uncached tail of a cached prompt; set by the runner):
            they attend on the prefill kernel whatever their length, so a prompt's
            logits and KV are the same bits cold or cached (``attention_torch``).
    """

    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    page_tables: torch.Tensor  # [S, max_pages] int64
    sample_rows: torch.Tensor  # [R] int64
    q_starts: list[int]
    start_pos: list[int]
    kv_lens: list[int]
    sampled: list[int]
    page_size: int
    sample_counts: list[int] = field(default_factory=list)
    prompt_spans: list[tuple[int, int, int]] = field(default_factory=list)
    sample_select: torch.Tensor | None = None
    prompt_seqs: frozenset[int] = frozenset()

    @property
    def num_tokens(self) -> int:
        """T, the number of new tokens."""
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        """S, the number of sequences."""
        return len(self.start_pos)

    def q_len(self, i: int) -> int:
        """New tokens of sequence ``i``."""
        return self.q_starts[i + 1] - self.q_starts[i]

    def attention_pairs(self) -> int:
        """(query token, key token) pairs this step's attention scores: ``Σ q_i · kv_i``
        over its sequences (new tokens times context length, the new ones included; a
        causal kernel skips about half of a prefill's, an unfused one writes them all)."""
        return sum(self.q_len(i) * n for i, n in enumerate(self.kv_lens))


def build_batch(
    work: Sequence[SeqWork],
    *,
    page_size: int,
    num_pages: int,
    max_context: int,
    vocab_size: int,
    device: torch.device | str = "cpu",
    prompt_rows: Sequence[int] | None = None,
) -> StepBatch:
    """Flatten and validate a step's work.

    Args:
        work: the sequences of the step (at least one).
        page_size: tokens per KV page.
        num_pages: pages in the KV pool (valid page indices are 0..num_pages-1).
        max_context: the largest allowed ``start_pos + len(token_ids)``.
        vocab_size: token ids must lie in 0..vocab_size-1.
        device: where the tensors go.
        prompt_rows: per work item, rows before its sample row (or its last rows, when
            it does not sample) whose logits are wanted too (prompt logprobs; None: 0).
    Returns:
        The ``StepBatch``.
    Raises:
        ValueError: empty work or token list, duplicate rid, negative start, token id out
            of range, context beyond ``max_context``, page table too short or naming a page
            outside the pool, two tokens written to the same KV slot, or proposals to
            verify without ``sample`` or without a token before them.
    """
    if not work:
        raise ValueError("step has no work")
    tokens: list[int] = []
    positions: list[int] = []
    q_starts, start_pos, kv_lens, sampled, sample_rows = [0], [], [], [], []
    sample_counts: list[int] = []
    prompt_spans: list[tuple[int, int, int]] = []
    select: list[int] = []
    seen: set[str] = set()
    max_pages = 1
    for i, w in enumerate(work):
        n = len(w.token_ids)
        if w.rid in seen:
            raise ValueError(f"request {w.rid!r} appears twice in one step")
        seen.add(w.rid)
        if n == 0:
            raise ValueError(f"request {w.rid!r}: empty token_ids")
        if w.start_pos < 0:
            raise ValueError(f"request {w.rid!r}: negative start_pos {w.start_pos}")
        end = w.start_pos + n
        if end > max_context:
            raise ValueError(
                f"request {w.rid!r}: positions up to {end - 1} exceed max_context {max_context}"
            )
        lo, hi = min(w.token_ids), max(w.token_ids)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"request {w.rid!r}: token id out of range 0..{vocab_size - 1}")
        need = -(-end // page_size)
        if len(w.page_table) < need:
            raise ValueError(
                f"request {w.rid!r}: page table has {len(w.page_table)} pages, positions "
                f"0..{end - 1} need {need}"
            )
        if min(w.page_table) < 0 or max(w.page_table) >= num_pages:
            raise ValueError(
                f"request {w.rid!r}: page index out of range 0..{num_pages - 1} in page table"
            )
        max_pages = max(max_pages, len(w.page_table))
        tokens.extend(w.token_ids)
        positions.extend(range(w.start_pos, end))
        q_starts.append(q_starts[-1] + n)
        start_pos.append(w.start_pos)
        kv_lens.append(end)
        if w.num_draft and not (0 < w.num_draft < n and w.sample):
            raise ValueError(
                f"request {w.rid!r}: {w.num_draft} proposals to verify among {n} tokens "
                f"(need fewer than n, and sample set)"
            )
        extra = prompt_rows[i] if prompt_rows else 0
        if extra:
            end = q_starts[-1] - (1 if w.sample else 0)
            if w.num_draft or extra > end - q_starts[-2]:
                raise ValueError(f"request {w.rid!r}: {extra} prompt rows among {n} tokens")
            prompt_spans.append((i, len(sample_rows), extra))
            sample_rows.extend(range(end - extra, end))
        if w.sample:
            sampled.append(i)
            select.extend(range(len(sample_rows), len(sample_rows) + w.num_draft + 1))
            sample_rows.extend(range(q_starts[-1] - 1 - w.num_draft, q_starts[-1]))
            sample_counts.append(w.num_draft + 1)

    slots = [  # [T] KV slot of each new token
        w.page_table[p // page_size] * page_size + p % page_size
        for w in work
        for p in range(w.start_pos, w.start_pos + len(w.token_ids))
    ]
    if len(set(slots)) != len(slots):
        raise ValueError("two tokens of this step write the same KV slot (shared page?)")
    pt = torch.tensor(  # [S, max_pages]
        [list(w.page_table) + [0] * (max_pages - len(w.page_table)) for w in work],
        dtype=torch.int64,
    )
    return StepBatch(
        token_ids=torch.tensor(tokens, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        page_tables=pt.to(device),
        sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=device),
        q_starts=q_starts,
        start_pos=start_pos,
        kv_lens=kv_lens,
        sampled=sampled,
        page_size=page_size,
        sample_counts=sample_counts,
        prompt_spans=prompt_spans,
        sample_select=torch.tensor(select, dtype=torch.int64, device=device)
        if prompt_spans
        else None,
    )


def prefill_warmup_batch(
    n: int, *, page_size: int, num_pages: int, vocab_size: int, device: torch.device | str = "cpu"
) -> StepBatch:
    """A prefill step of one ``n``-token prompt on pages ``0 .. ceil(n / page_size) - 1``,
    for timing at startup (its K/V is garbage that no real step reads before rewriting).
    ``n`` <= ``num_pages * page_size``."""
    pages = list(range(-(-n // page_size)))
    work = [
        SeqWork(
            rid="warmup-prefill",
            token_ids=[1 + i % (vocab_size - 1) for i in range(n)],
            start_pos=0,
            page_table=pages,
            sample=True,
        )
    ]
    return build_batch(
        work,
        page_size=page_size,
        num_pages=num_pages,
        max_context=n,
        vocab_size=vocab_size,
        device=device,
    )


def warmup_batch(
    n: int, *, page_size: int, num_pages: int, vocab_size: int, device: torch.device | str = "cpu"
) -> StepBatch:
    """A decode step of ``n`` one-token sequences on pages ``0 .. n-1``, for timing at
    startup (their garbage K/V is never read: a real step rewrites a position before
    any sequence attends to it). ``n`` <= ``num_pages``."""
    work = [
        SeqWork(rid=f"warmup{i}", token_ids=[1 + i], start_pos=0, page_table=[i], sample=True)
        for i in range(n)
    ]
    return build_batch(
        work,
        page_size=page_size,
        num_pages=num_pages,
        max_context=1,
        vocab_size=vocab_size,
        device=device,
    )
