"""Jump-forward's catch-up tokens beside free requests: a pass of their own.

Jump-forward (``houchu.model.grammar.jump_forward``) appends the tokens a grammar forces to its
request without a forward pass; the scheduler then feeds them as one multi-token chunk,
its sampled token followed by the forced ones. Put in the same forward pass as other
requests' decode rows, those extra rows change the pass the others run: more rows take
another decode path of the measured route (``houchu.runner.autotune``, per bucket of
rows: "b<=8 fused-a8" and "b<=16 dense" compute different floats), and a chunk longer
than ``MAX_EXTEND_AS_DECODE`` makes the step a prefill one (no fused layers, compiled
step or CUDA graph). A constrained request then changed the greedy output of the free
requests beside it, which a request with logprobs (no jump-forward) or another free
request did not.

So when a step holds a catch-up chunk and a request without a grammar, the runner
splits it in two passes (``split_passes``):

1. the step as it would be without jump-forward: each catch-up chunk cut to its first
   token, sampled as a decode row is (its logits are dropped), and each step the overlap
   scheduler planned before the forced tokens (``drop_stale_samples``: it draws
   nothing) sampled as planned (dropped too). The free rows compute exactly what they
   would beside a request that decodes one token per step;
2. the catch-up chunks' other tokens, attending over the first pass's KV; their last
   rows sample.

The logits come back in the layout of the whole step's batch (``Passes.run``), so the
grammar masks, the sampler and the prompt logprobs see one step. The second pass costs
a forward pass of its own (a step of only constrained requests is not split): the
jump-forward ledger charges it to the step's catch-up requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import msgspec
import torch

from houchu.model.batch import StepBatch
from houchu.model.grammar.jump_forward import JumpForward
from houchu.model.sampling.sampler import RequestState
from houchu.transport.messages import SeqWork


@dataclass
class Passes:
    """A step split in two forward passes.

    Attributes:
        first: the step's work as it would be without jump-forward (the plan's order).
        prompt_rows: prompt rows scored per item of ``first`` (the plan's).
        rest: each catch-up chunk's tokens after its first, in the plan's order.
        moved: the index in the plan's work of each item of ``rest``.
        dropped: indices of the items ``first`` samples only to keep its shape (every
            catch-up chunk's first token, the steps planned before forced tokens).
    """

    first: list[SeqWork]
    prompt_rows: list[int]
    rest: list[SeqWork]
    moved: list[int]
    dropped: list[int]

    def parts(self) -> list[tuple[list[SeqWork], list[int]]]:
        """Each pass's work and prompt rows per item, in order (what a tensor-parallel
        runner's other ranks run)."""
        out = [(self.first, self.prompt_rows)]
        if self.rest:
            out.append((self.rest, [0] * len(self.rest)))
        return out

    def run(
        self,
        whole: StepBatch,
        build: Callable[[list[SeqWork], list[int]], StepBatch],
        forward: Callable[[StepBatch], torch.Tensor],
        jump: JumpForward,
        send: Callable[[list[SeqWork], list[int]], None],
    ) -> torch.Tensor:
        """Both passes' logits in the layout of ``whole`` (the batch of the whole step):
        ``[len(whole.sample_rows), V]`` float32. The second pass's seconds are charged
        to its requests in ``jump``'s ledger.

        Args:
            whole: the step's batch (its rows are what the caller expects).
            build: (work, prompt rows per item) -> that work's batch.
            forward: a batch -> its ``[R, V]`` float32 logits.
            jump: the runner's jump-forward (its ledger).
            send: (work, prompt rows) -> sent to a tensor-parallel runner's other ranks
                (``houchu.runner.tensor_parallel.group.send_pass``; the first pass's was sent with the step's validation).
        """
        batches = [build(work, rows) for work, rows in self.parts()]
        logits = [forward(batches[0])]  # [R1, V]
        if len(batches) > 1:
            t0 = time.perf_counter()
            send(self.rest, [0] * len(self.rest))  # the other ranks' next pass: this one
            logits.append(forward(batches[1]))  # [R2, V]
            jump.charge([w.rid for w in self.rest], time.perf_counter() - t0)
        src = _sources(whole, batches[0], batches[1] if len(batches) > 1 else None, self.moved)
        joined = torch.cat(logits) if len(logits) > 1 else logits[0]  # [R1 + R2, V]
        return joined.index_select(0, torch.tensor(src, device=joined.device))


def split_passes(
    work: Sequence[SeqWork],
    prompt_rows: Sequence[int],
    state_of: Callable[[str], RequestState],
    constrained: Collection[str],
    stale: set[str],
) -> Passes | None:
    """The two passes of a step (see the module docstring), or None when it runs as one:
    no catch-up chunk and no step planned before forced tokens, or no request without
    a grammar.

    A catch-up chunk is the work item of a constrained request past its prompt with more
    than one token and no proposals: a decode row plus the tokens its grammar forced.

    Args:
        work: the step's work items (placeholders resolved).
        prompt_rows: prompt rows scored per item.
        state_of: rid -> its sampling state (its prompt).
        constrained: the rids with a grammar.
        stale: rids whose item ``drop_stale_samples`` told to draw nothing.
    """
    if all(w.rid in constrained for w in work):
        return None
    first, rest, moved, dropped = [], [], [], []
    for i, w in enumerate(work):
        if w.rid not in constrained:
            first.append(w)
        elif _catch_up(w, prompt_rows[i], len(state_of(w.rid).prompt_ids)):
            first.append(msgspec.structs.replace(w, token_ids=w.token_ids[:1], sample=True))
            rest.append(
                msgspec.structs.replace(w, token_ids=w.token_ids[1:], start_pos=w.start_pos + 1)
            )
            moved.append(i)
            dropped.append(i)
        elif w.rid in stale and not w.sample and not w.num_draft:
            first.append(msgspec.structs.replace(w, sample=True))
            dropped.append(i)
        else:
            first.append(w)
    if not dropped:
        return None
    return Passes(first, list(prompt_rows), rest, moved, dropped)


def _catch_up(w: SeqWork, prompt_rows: int, prompt_len: int) -> bool:
    """Whether ``w`` is a catch-up chunk: past the prompt, more than one token, no
    proposals and no prompt rows scored."""
    return (
        len(w.token_ids) > 1 and not w.num_draft and not prompt_rows and w.start_pos >= prompt_len
    )


def sample_row_at(batch: StepBatch) -> dict[int, int]:
    """Sequence index -> the row of ``batch.sample_rows`` of its first sampled row (its
    prompt rows, when scored, come just before it)."""
    prompt = {i: n for i, _, n in batch.prompt_spans}
    counts = dict(zip(batch.sampled, batch.sample_counts, strict=True))
    out, row = {}, 0
    for i in range(batch.num_seqs):
        row += prompt.get(i, 0)
        if i in counts:
            out[i] = row
            row += counts[i]
    return out


def _sources(
    whole: StepBatch, first: StepBatch, rest: StepBatch | None, moved: Sequence[int]
) -> list[int]:
    """For each row of ``whole``'s logits, its row in the first pass's logits followed
    by the second's (``moved[k]``: the sequence of ``whole`` that is ``rest``'s ``k``)."""
    src = [0] * int(whole.sample_rows.numel())
    first_at = sample_row_at(first)
    first_prompt = {i: row for i, row, _ in first.prompt_spans}
    for i, row, n in whole.prompt_spans:  # the same rows of the same sequence
        src[row : row + n] = range(first_prompt[i], first_prompt[i] + n)
    offset = int(first.sample_rows.numel())
    rest_at = sample_row_at(rest) if rest is not None else {}
    from_rest = {seq: offset + rest_at[k] for k, seq in enumerate(moved) if k in rest_at}
    for i, row in sample_row_at(whole).items():
        count = whole.sample_counts[whole.sampled.index(i)]
        base = from_rest.get(i, first_at[i])
        src[row : row + count] = range(base, base + count)
    return src
