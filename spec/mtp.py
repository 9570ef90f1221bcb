"""An MTP proposer: the checkpoint's own next-token-prediction layer
(``houchu.model.mtp``) proposes, from the target's hidden states.

The draft actor is a process of its own, so it runs its own copy of the target's blocks
to get those hidden states (the runner keeps its activations). Per request it holds the
true tokens ``t_0 .. t_n``; the target's KV and final hidden state are computed for them
once (rows never recomputed while the sequence only grows), and the MTP layer's KV for
positions ``0 .. n - 1`` (row ``i`` pairs ``h_i`` with ``t_{i+1}``)::

    trunk pass  t_c .. t_n              -> h_c .. h_n              (target KV)
    MTP pass    (h_{c-1}..h_{n-1}, t_c..t_n) at positions c-1..n-1 -> d_1   (MTP KV)
    chain       (g, d_j) at position n - 1 + j                     -> d_{j+1}

``d_1`` guesses ``t_{n+1}``; each chained proposal feeds the layer its own output ``g``.
A chained row's MTP KV is overwritten by the true row of its position on the next call.
Proposals are greedy (the best guess under the point-mass acceptance rule of
``houchu.model.verify``). When the pool is full the least recently used other requests'
state is dropped (recomputed when they next speculate); a sync that rewrites tokens
already computed drops the request's state too.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from houchu.kvcache.page_allocator import PageAllocator
from houchu.model.batch import StepBatch, build_batch
from houchu.model.kv_pool import KVPool
from houchu.model.mtp import MTPLayer, trunk_hidden
from houchu.spec.proposers import check_starts, reserve_pages
from houchu.transport.messages import SeqWork
from houchu.transport.spec_messages import DraftSeq

if TYPE_CHECKING:
    from houchu.model.model_runner import ModelRunner
    from houchu.options.runner_options import RunnerOptions


class _MTPSeq:
    """One request's state: true tokens, how many have target KV, the last one's hidden
    state ``[hidden]`` (None before the first pass), pages, last use."""

    __slots__ = ("tokens", "num_computed", "hidden", "pages", "last_used")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.num_computed = 0
        self.hidden: torch.Tensor | None = None
        self.pages: list[int] = []
        self.last_used = 0

    def sync(self, start: int, true_ids: list[int]) -> None:
        """Replace tokens from ``start`` on; rewriting computed ones resets the state."""
        c = self.num_computed
        if start < c and self.tokens[start:c] != true_ids[: c - start]:
            self.num_computed, self.hidden = 0, None
        self.tokens[start:] = true_ids
        self.num_computed = min(self.num_computed, len(self.tokens))


class MTPProposer:
    """Greedy proposals from the checkpoint's MTP layer.

    Args:
        runner: a ``ModelRunner`` of the target checkpoint (its model, pool and backend
            are used directly; this proposer owns them from now on).
        mtp: the checkpoint's MTP module, on the runner's device.
    """

    def __init__(self, runner: ModelRunner, mtp: MTPLayer) -> None:
        self.runner, self.mtp = runner, mtp
        pool = runner.pool
        self.page_size = pool.page_size
        self.mtp_pool = KVPool.for_model(
            mtp.pool_config(),
            page_size=pool.page_size,
            dtype=runner.model.dtype,
            device=runner.device,
            num_pages=pool.num_pages,
        )
        self.allocator = PageAllocator(pool.num_pages, self.page_size)
        self.max_context = runner.max_context
        self.vocab_size = runner.config.vocab_size
        self.seqs: dict[str, _MTPSeq] = {}
        self._clock = itertools.count(1)
        self.num_passes = 0  # forward passes run (trunk and MTP)

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    def pool_usage(self) -> tuple[int, int]:
        return self.allocator.num_used, self.allocator.num_pages

    def release(self, rids: list[str]) -> None:
        for rid in rids:
            seq = self.seqs.pop(rid, None)
            if seq is not None:
                self.allocator.free(seq.pages)

    def propose(self, seqs: list[DraftSeq]) -> dict[str, list[int]]:
        check_starts(seqs, {rid: len(s.tokens) for rid, s in self.seqs.items()})
        now = next(self._clock)
        out: dict[str, list[int]] = {}
        live: list[tuple[str, _MTPSeq, int]] = []
        for s in seqs:
            seq = self.seqs.setdefault(s.rid, _MTPSeq())
            seq.sync(s.start, s.token_ids)
            if seq.num_computed == len(seq.tokens):  # nothing new: recompute from scratch
                seq.num_computed, seq.hidden = 0, None
            seq.last_used = now
            out[s.rid] = []
            n = len(seq.tokens) - 1  # the last true token's position
            k = min(s.k, self.max_context - n)  # d_k's MTP row sits at n + k - 2
            if n >= 1 and k > 0 and self._reserve(seq, max(n + 1, n + k - 1), now):
                live.append((s.rid, seq, k))
        if live:
            with torch.inference_mode():
                self._run(live, out)
        return out

    # ------------------------------------------------------------------ internals

    def _batch(self, work: list[SeqWork]) -> StepBatch:
        """The flattened pass over ``work`` on the runner's device."""
        r = self.runner
        return build_batch(
            work,
            page_size=self.page_size,
            num_pages=r.pool.num_pages,
            max_context=self.max_context,
            vocab_size=self.vocab_size,
            device=r.device,
        )

    def _run(self, live: list[tuple[str, _MTPSeq, int]], out: dict[str, list[int]]) -> None:
        """The trunk pass over each sequence's new true tokens, then the MTP passes."""
        model, r = self.runner.model, self.runner
        trunk = [
            SeqWork(
                rid=rid,
                token_ids=q.tokens[q.num_computed :],
                start_pos=q.num_computed,
                page_table=q.pages,
                sample=False,
            )
            for rid, q, _ in live
        ]
        batch = self._batch(trunk)
        h = trunk_hidden(model, batch, r.pool, r.backend)  # [T, hidden]
        self.num_passes += 1
        rows = {w.rid: h[batch.q_starts[i] : batch.q_starts[i + 1]] for i, w in enumerate(trunk)}
        work, prev = [], []
        for rid, q, _ in live:
            c, new = q.num_computed, rows[rid]  # new: h_c .. h_n, [n - c + 1, hidden]
            # MTP rows j = max(c, 1) .. n: (h_{j-1}, t_j) at position j - 1
            if c >= 1:
                assert q.hidden is not None
                prev.append(torch.cat([q.hidden[None], new[:-1]]))  # [n - c + 1, hidden]
            else:
                prev.append(new[:-1])  # [n, hidden]
            first = max(c, 1)
            work.append(
                SeqWork(
                    rid=rid,
                    token_ids=q.tokens[first:],
                    start_pos=first - 1,
                    page_table=q.pages,
                    sample=True,
                )
            )
            q.hidden, q.num_computed = new[-1], len(q.tokens)
        self._mtp_passes(live, work, prev, out)

    def _mtp_passes(
        self,
        live: list[tuple[str, _MTPSeq, int]],
        work: list[SeqWork],
        prev: list[torch.Tensor],
        out: dict[str, list[int]],
    ) -> None:
        """MTP passes until every sequence has its ``k`` proposals."""
        r = self.runner
        want = {rid: k for rid, _, k in live}
        while work:
            batch = self._batch(work)
            g, logits = self.mtp(batch, torch.cat(prev), r.model, self.mtp_pool, r.backend)
            self.num_passes += 1
            picks = logits.argmax(-1).tolist()  # [R]
            nxt, nxt_prev = [], []
            for i, w in enumerate(work):
                out[w.rid].append(picks[i])
                if len(out[w.rid]) < want[w.rid]:
                    pos = w.start_pos + len(w.token_ids)
                    nxt.append(
                        SeqWork(
                            rid=w.rid,
                            token_ids=[picks[i]],
                            start_pos=pos,
                            page_table=w.page_table,
                            sample=True,
                        )
                    )
                    nxt_prev.append(g[i : i + 1])
            work, prev = nxt, nxt_prev

    def _reserve(self, seq: _MTPSeq, num_tokens: int, now: int) -> bool:
        """``reserve_pages`` for ``seq``: a victim loses its pages and its hidden states."""
        return reserve_pages(self.allocator, self.seqs, seq, num_tokens, now, _drop_mtp_state)


def make_mtp_proposer(model_path: str, options: RunnerOptions) -> tuple[MTPProposer, str]:
    """The MTP proposer of the checkpoint at ``model_path`` (checked first, so that a
    checkpoint without MTP layers fails before any weight is loaded), and a one-line
    description.

    Raises:
        houchu.model.mtp.MTPUnavailable: the checkpoint has no MTP layer.
        ModelLoadError: the model cannot be loaded.
    """
    import msgspec

    from houchu.model.config import resolve_model_file
    from houchu.model.model_runner import ModelRunner
    from houchu.model.mtp import load_mtp_tensors, mtp_layer_index

    path = resolve_model_file(model_path)
    layer = mtp_layer_index(path)
    runner = ModelRunner(
        path, msgspec.structs.replace(options, disable_fused_layers=True), quiet=True
    )
    with torch.inference_mode():
        mtp = MTPLayer(runner.model, load_mtp_tensors(path, layer, runner.model.dtype), layer)
        for m in mtp.modules():
            if hasattr(m, "prepare_cpu_gemv"):
                m.prepare_cpu_gemv()
    p = MTPProposer(runner, mtp)
    _, total = p.pool_usage()
    return p, (
        f"MTP layer {layer} of {runner.config.name!r} over a copy of its "
        f"{runner.config.num_layers} blocks: {total} pages x {p.page_size} tokens"
    )


def _drop_mtp_state(q: _MTPSeq) -> None:
    """A sequence whose pages were taken: nothing of it is computed any more."""
    q.num_computed, q.hidden = 0, None
