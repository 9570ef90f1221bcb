"""The MTP proposer, inside the model runner: the checkpoint's own next-token-prediction
layer (``houchu.model.mtp``) proposes from the target's final hidden states of the step
that just ran — no second copy of the target, no draft actor (the design of SGLang's
EAGLE/NextN worker and vLLM's MTP proposer).

With it attached, every target pass runs eagerly and keeps its final hidden states
``h`` for all new rows (``LlamaModel.final_hidden``). After sampling, one MTP pass (the
"extend") covers each work item's true positions: row ``i`` pairs ``h_i`` with the token
after it, ``t_{i+1}`` (the next prompt token, an accepted proposal, or the token just
sampled), so the layer's own KV (a one-layer pool addressed by the scheduler's page
tables: position ``i`` of a request sits in the same slot as its target KV) stays
complete. The row of the last true position ``n`` (paired with the sampled ``t_{n+1}``)
gives ``d_1``, a guess of ``t_{n+2}``; proposals ``d_2 .. d_k`` chain the layer on its
own output ``g`` at positions ``n + 1 .. n + k - 1``::

    step's work   t_s .. t_n (+ proposals to verify)      -> h_s .. h_n, t_{n+1} sampled
    extend        (h_s .. h_n, t_{s+1} .. t_{n+1}) at s .. n -> d_1        (MTP KV)
    chain         (g, d_j) at position n + j                 -> d_{j+1}

Proposals travel back with the ``StepResult`` and are verified in the next step like
any other proposer's. The last row of a prefill chunk that does not sample waits for
the next chunk's first token (its hidden state is kept until then). Chained rows past
a request's pages go to scratch pages of the MTP pool (``SCRATCH_SEQS`` requests per
step; the others get only the proposals their own pages hold, at least ``d_1``); they
are overwritten by true rows later, as are the chained rows in the request's own pages.

What is approximate (acceptance only, never the output): a radix-cache hit reuses the
MTP KV its owner wrote, whose row at the last cached position was paired with the
owner's next token; pages loaded from the host/SSD tiers carry no MTP KV.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from houchu.model.batch import StepBatch, build_batch
from houchu.model.kv.pool import KVPool
from houchu.model.mtp import MTPLayer, load_mtp_layer
from houchu.transport.limits import tokens_left
from houchu.transport.messages import SeqOutput, SeqWork, StepPlan

if TYPE_CHECKING:
    from houchu.runner.model_runner import ModelRunner

#: Requests per step whose chained rows may go past their own pages (to scratch pages).
SCRATCH_SEQS = 64


class MTPDrafter:
    """Greedy proposals from the checkpoint's MTP layer, run by the model runner.

    Args:
        runner: the target's ``ModelRunner`` (its model, pool geometry, backend, device).
        mtp: the checkpoint's MTP module, on the runner's device.
        max_proposals: the most proposals one request may ask for
            (``--num-speculative-tokens``; sizes the scratch pages).
    """

    def __init__(self, runner: ModelRunner, mtp: MTPLayer, max_proposals: int) -> None:
        self.model, self.backend, self.mtp = runner.model, runner.backend, mtp
        self.target_pool = runner.pool
        self.device, self.max_context = runner.device, runner.max_context
        self.page_size = ps = runner.pool.page_size
        self.num_pages = runner.pool.num_pages  # the scheduler's page ids are below it
        per_seq = -(-max(max_proposals, 1) // ps) + 1
        self.pool = KVPool.for_model(
            mtp.pool_config(),
            page_size=ps,
            dtype=runner.model.dtype,
            device=runner.device,
            num_pages=self.num_pages + SCRATCH_SEQS * per_seq,
        )
        #: rid -> (position, its final hidden state ``[hidden]``) of a prefill chunk's
        #: last row, whose next token comes with the next chunk
        self.pending: dict[str, tuple[int, torch.Tensor]] = {}
        self.hidden: torch.Tensor | None = None  # ``[T, hidden]`` of the last target pass
        self.num_passes = 0  # MTP passes run (extend and chain)

    def target_logits(self, batch: StepBatch) -> torch.Tensor:
        """The target's pass over ``batch`` (eager), keeping every row's final hidden
        state for ``step``: logits ``[R, vocab]`` float32 for ``batch.sample_rows``."""
        self.hidden = self.model.final_hidden(batch, self.target_pool, self.backend)
        return self.model.logits_at(self.hidden.index_select(0, batch.sample_rows))

    def forget(self) -> None:
        """Drop every request's pending row (their scheduler is gone)."""
        self.pending.clear()

    def step(
        self, plan: StepPlan, batch: StepBatch | None, outputs: list[SeqOutput]
    ) -> tuple[dict[str, list[int]], float]:
        """After the target's pass over ``plan`` (``batch``, sampled ``outputs``): the MTP
        passes, and up to ``SeqWork.num_propose`` proposals per sampling work item.

        Returns:
            (rid -> proposed token ids, seconds spent). A failure of the MTP passes costs
            the proposals (and the pending rows), never the step: it is printed and
            ``({}, seconds)`` returned, as the draft actor does.
        """
        t0 = time.perf_counter()
        for rid in plan.release:
            self.pending.pop(rid, None)
        hidden, self.hidden = self.hidden, None
        if batch is None or hidden is None:
            return {}, time.perf_counter() - t0
        emitted: dict[str, list[int]] = {}
        for o in outputs:
            if not o.forced:  # jump-forward's tokens: computed in the next step, as a chunk
                emitted.setdefault(o.rid, []).append(o.token_id)
        try:
            out = self._propose(plan.work, batch, hidden, emitted)
        except Exception:  # a model failure costs proposals, never the request
            traceback.print_exc()
            self.pending.clear()
            out = {}
        for rid in {o.rid for o in outputs if o.forced}:  # forced tokens come next instead
            out.pop(rid, None)
        return out, time.perf_counter() - t0

    # ------------------------------------------------------------------ internals

    def _propose(
        self,
        work: list[SeqWork],
        batch: StepBatch,
        hidden: torch.Tensor,
        emitted: dict[str, list[int]],
    ) -> dict[str, list[int]]:
        """The extend pass over every work item's true rows, then the chain."""
        rows: list[SeqWork] = []
        prev: list[torch.Tensor] = []
        want: dict[str, int] = {}
        for i, w in enumerate(work):
            h = hidden[batch.q_starts[i] : batch.q_starts[i + 1]]  # [n, hidden]
            item = self._rows(w, h, emitted.get(w.rid))
            if item is None:
                continue
            sw, h_rows = item
            rows.append(sw)
            prev.append(h_rows)
            if sw.sample:
                # d_1 from the last row, then one chained row per further proposal at
                # positions _last + 1, _last + 2, ...: each inside the window
                want[w.rid] = min(w.num_propose, 1 + tokens_left(self.max_context, _last(sw) + 1))
        if not rows:
            return {}
        out: dict[str, list[int]] = {rid: [] for rid in want}
        g, picks = self._pass(rows, prev)
        chain, chain_prev = [], []
        scratch = iter(range(self.num_pages, self.pool.num_pages))
        for r, sw in enumerate(s for s in rows if s.sample):
            out[sw.rid].append(picks[r])
            k = want[sw.rid]
            if k > 1:
                table, k = self._chain_pages(sw.page_table, _last(sw), k, scratch)
                want[sw.rid] = k
                if k > 1:
                    chain.append(_row(sw.rid, picks[r], _last(sw) + 1, table))
                    chain_prev.append(g[r : r + 1])
        while chain:
            g, picks = self._pass(chain, chain_prev)
            nxt, nxt_prev = [], []
            for r, sw in enumerate(chain):
                out[sw.rid].append(picks[r])
                if len(out[sw.rid]) < want[sw.rid]:
                    nxt.append(_row(sw.rid, picks[r], sw.start_pos + 1, sw.page_table))
                    nxt_prev.append(g[r : r + 1])
            chain, chain_prev = nxt, nxt_prev
        return out

    def _rows(
        self, w: SeqWork, h: torch.Tensor, emitted: list[int] | None
    ) -> tuple[SeqWork, torch.Tensor] | None:
        """Work item ``w``'s MTP rows (None: none): each true position with the token
        after it, the pending row of the chunk before first; their hidden states."""
        start = w.start_pos
        if w.sample:
            if not emitted:
                return None  # failed alone: nothing was emitted
            real = len(w.token_ids) - w.num_draft + len(emitted) - 1  # true positions
            nxt, h = w.token_ids[1:real] + [emitted[-1]], h[:real]
        else:
            nxt, last = w.token_ids[1:], (start + len(w.token_ids) - 1, h[-1])
            h = h[:-1]
        pend = self.pending.pop(w.rid, None)
        if pend is not None and pend[0] == start - 1:
            nxt, h, start = [w.token_ids[0], *nxt], torch.cat([pend[1][None], h]), start - 1
        if not w.sample:
            self.pending[w.rid] = last
        if not nxt:
            return None
        sw = _row(w.rid, 0, start, w.page_table)
        sw.token_ids, sw.sample = nxt, w.sample and w.num_propose > 0
        return sw, h

    def _chain_pages(
        self, table: list[int], last: int, k: int, scratch: Iterator[int]
    ) -> tuple[list[int], int]:
        """The page table for chained rows at ``last + 1 .. last + k - 1`` (scratch pages
        past ``table``), and the ``k`` it allows (fewer when the scratch is used up)."""
        ps = self.page_size
        need = -(-(last + k) // ps) - len(table)
        extra = [p for _, p in zip(range(need), scratch, strict=False)]
        if len(extra) < need:  # only what its own pages hold
            return table, max(min(k, len(table) * ps - last), 1)
        return table + extra, k

    def _pass(self, rows: list[SeqWork], prev: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """One MTP pass: (g ``[R, hidden]``, greedy picks of its sampled rows)."""
        batch = build_batch(
            rows,
            page_size=self.page_size,
            num_pages=self.pool.num_pages,
            max_context=self.max_context,
            vocab_size=self.model.cfg.vocab_size,
            device=self.device,
        )
        g, logits = self.mtp(batch, torch.cat(prev), self.model, self.pool, self.backend)
        self.num_passes += 1
        return g, logits.argmax(-1).tolist()


def _row(rid: str, token: int, pos: int, table: list[int]) -> SeqWork:
    """One sampled MTP row: ``token`` at position ``pos``."""
    return SeqWork(rid=rid, token_ids=[token], start_pos=pos, page_table=table, sample=True)


def _last(sw: SeqWork) -> int:
    """The position of ``sw``'s last row."""
    return sw.start_pos + len(sw.token_ids) - 1


def attach_mtp(runner: ModelRunner, model_path: str, max_proposals: int) -> str:
    """Give ``runner`` the checkpoint's MTP layer as its proposer (``runner.mtp``);
    returns a one-line description.

    Raises:
        houchu.model.mtp.MTPUnavailable: the checkpoint has no MTP layer.
        ValueError: a tensor-parallel runner (its ranks hold slices of the hidden
            states).
    """
    if runner.tp is not None:
        raise ValueError("--speculative mtp does not combine with --tensor-parallel-size > 1")
    from houchu.model.config.core import resolve_model_file

    mtp = load_mtp_layer(runner.model, resolve_model_file(model_path))
    drafter = MTPDrafter(runner, mtp, max_proposals)
    runner.mtp = drafter
    return (
        f"MTP layer {mtp.layer} of {runner.config.name!r} proposes in the runner, from its "
        f"final hidden states ({drafter.pool.num_pages} MTP pages x {drafter.page_size} "
        "tokens); target steps run eagerly (no fused layers, compiled step or CUDA graphs)"
    )
