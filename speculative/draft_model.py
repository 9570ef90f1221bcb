"""A draft model proposer: a (smaller) causal LM sharing the target's tokenizer proposes
its greedy continuation, with its own paged KV that is rolled back on rejection.

Per request it holds the tokens it has seen — true tokens, then its own last proposals —
and how many of them have KV in its pool::

    | true tokens (synced) ................. | own proposals d_1 .. d_k |
    | 0 ........... num_computed - 1 | rest: KV not computed yet        |

A sync keeps the longest common prefix of its proposals and the new true tokens (the
accepted ones, KV included) and rolls ``num_computed`` and the page list back to it.
Proposing runs one pass that catches every sequence up (its whole prompt the first time)
and samples ``d_1``, then ``k - 1`` one-token passes; ``d_k`` gets no KV. Proposals are
greedy: under the point-mass acceptance rule (``houchu.model.sampling.verify``) a proposal is
accepted with the target's probability of it, so the draft's most likely token is its
best guess for any sampling parameters.

The model runs in a ``houchu.runner.model_runner.ModelRunner`` (its weights, pool and sampler);
pages come from this proposer's own ``PageAllocator``. When the pool is full, the KV of
the least recently used other requests is dropped (recomputed when they next speculate);
a request that still does not fit gets no proposal this time.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.speculative.proposers import check_starts, reserve_pages
from houchu.transport.limits import tokens_left
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from houchu.transport.spec_messages import DraftSeq

if TYPE_CHECKING:
    from houchu.runner.model_runner import ModelRunner

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 30)


class _DraftSeq:
    """One request's draft state (see the module docstring)."""

    __slots__ = ("rid", "tokens", "num_computed", "pages", "last_used")

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.tokens: list[int] = []
        self.num_computed = 0
        self.pages: list[int] = []
        self.last_used = 0

    def sync(self, start: int, true_ids: list[int]) -> None:
        """Replace tokens from ``start`` on by ``true_ids``, keeping the KV of the common
        prefix with what was held there."""
        held = self.tokens[start:]
        common = 0
        for a, b in zip(held, true_ids, strict=False):
            if a != b:
                break
            common += 1
        self.tokens[start:] = true_ids
        self.num_computed = min(self.num_computed, start + common, len(self.tokens) - 1)


class DraftModelProposer:
    """Greedy proposals from a draft model with paged KV.

    Args:
        runner: a ``ModelRunner`` holding the draft model (this proposer owns its pool and
            request states from now on).
        target_vocab_size: proposals are target token ids; a draft token at or beyond it
            ends the proposal.
    Raises:
        ValueError: the draft's vocabulary is smaller than the target's (the models do not
            share a tokenizer).
    """

    def __init__(self, runner: ModelRunner, target_vocab_size: int) -> None:
        if runner.config.vocab_size < target_vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({runner.config.vocab_size} tokens) is smaller "
                f"than the target's ({target_vocab_size}); they must share a tokenizer"
            )
        self.runner = runner
        self.target_vocab_size = target_vocab_size
        self.page_size = runner.pool.page_size
        self.allocator = PageAllocator(runner.pool.num_pages, self.page_size)
        self.max_context = runner.max_context
        self.seqs: dict[str, _DraftSeq] = {}
        self._steps = itertools.count()
        self._clock = itertools.count(1)
        self.num_passes = 0  # draft forward passes run

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    def pool_usage(self) -> tuple[int, int]:
        return self.allocator.num_used, self.allocator.num_pages

    def release(self, rids: list[str]) -> None:
        gone = [rid for rid in rids if rid in self.seqs]
        for rid in gone:
            seq = self.seqs.pop(rid)
            self.allocator.free(seq.pages)
        if gone:
            self.runner.execute(StepPlan(step_id=next(self._steps), work=[], release=gone))

    def propose(self, seqs: list[DraftSeq]) -> dict[str, list[int]]:
        check_starts(seqs, {rid: len(s.tokens) for rid, s in self.seqs.items()})
        now = next(self._clock)
        init, active, want = [], [], {}
        out: dict[str, list[int]] = {}
        for s in seqs:
            seq = self.seqs.get(s.rid)
            if seq is None:
                seq = self.seqs[s.rid] = _DraftSeq(s.rid)
                init.append(SeqInit(rid=s.rid, sampling=_GREEDY, prompt_ids=[]))
            seq.sync(s.start, s.token_ids)
            seq.last_used = now
            self._trim_pages(seq)
            # d_j's KV is written at len(seq.tokens) + j - 1, inside the window; d_k's is not
            k = min(s.k, 1 + tokens_left(self.max_context, len(seq.tokens)))
            out[s.rid] = []
            if k > 0 and seq.tokens and self._reserve(seq, len(seq.tokens) + k - 1, now):
                active.append(seq)
                want[s.rid] = k
        if init:
            self.runner.execute(StepPlan(step_id=next(self._steps), work=[], init=init))
        self._run(active, want, out)
        return out

    # ------------------------------------------------------------------ internals

    def _run(self, live: list[_DraftSeq], want: dict[str, int], out: dict[str, list[int]]) -> None:
        """Forward passes until every sequence has its proposals: the first catches each
        sequence up (all its tokens without KV), the next ones feed one token each. A
        token outside the target's vocabulary ends that sequence's proposal."""
        while live:
            work = [
                SeqWork(
                    rid=q.rid,
                    token_ids=q.tokens[q.num_computed :],
                    start_pos=q.num_computed,
                    page_table=q.pages,
                    sample=True,
                )
                for q in live
            ]
            res = self.runner.execute(StepPlan(step_id=next(self._steps), work=work))
            self.num_passes += 1
            sampled = {o.rid: o.token_id for o in res.outputs}
            still = []
            for q in live:
                q.num_computed = len(q.tokens)
                t = sampled[q.rid]
                if t >= self.target_vocab_size:
                    continue
                q.tokens.append(t)
                out[q.rid].append(t)
                if len(out[q.rid]) < want[q.rid]:
                    still.append(q)
            live = still

    def _trim_pages(self, seq: _DraftSeq) -> None:
        """Free the pages past the last one holding valid KV (rolled-back proposals)."""
        keep = self.allocator.pages_for(seq.num_computed)
        if len(seq.pages) > keep:
            self.allocator.free(seq.pages[keep:])
            del seq.pages[keep:]

    def _reserve(self, seq: _DraftSeq, num_tokens: int, now: int) -> bool:
        """``reserve_pages`` for ``seq``: a victim loses its pages and its computed count."""
        return reserve_pages(self.allocator, self.seqs, seq, num_tokens, now, _drop_draft_state)


def _drop_draft_state(q: _DraftSeq) -> None:
    """A sequence whose pages were taken: nothing of it is computed any more."""
    q.num_computed = 0
