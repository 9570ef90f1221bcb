"""The draft actor: proposes tokens for speculative decoding.

One inbox of ``DraftRequest`` messages from the scheduler; each is answered with one
``DraftReply`` (proposals, the seconds spent, the draft pool's counters). The proposer is
chosen by ``--speculative``: "ngram" (prompt lookup, no model), "draft" (a draft model
given by ``--draft-model``, with its own paged KV); "mtp" proposes in the model runner
(``houchu.speculative.mtp``) and starts no draft actor. The domain logic lives in
``houchu.speculative``. Started by the launcher only for those two. When the scheduler
is replaced, every sequence it held here is released (the new one starts from scratch).
"""

from __future__ import annotations

import time
import traceback

import zmq.asyncio

from houchu.options.runner_options import RunnerOptions
from houchu.options.serve_config import ServeConfig
from houchu.speculative.proposers import NgramProposer, Proposer, ProtocolError
from houchu.transport.actor_base import ActorBase
from houchu.transport.messages import ActorDown, ActorUp
from houchu.transport.spec_messages import DraftInbox, DraftProposal, DraftReply, DraftRequest


def draft_runner_options(target: RunnerOptions) -> RunnerOptions:
    """The draft model's runner options: the target's device, dtype, KV pool size,
    context cap and threads; the rest at the exact, eager settings (no quantization, no
    compiled step, fixed decode paths), as a draft always ran."""
    return RunnerOptions(
        device=target.device,
        dtype=target.dtype,
        page_size=target.page_size,
        num_pages=target.num_pages,
        kv_cache_mb=target.kv_cache_mb,
        max_context=target.max_context,
        threads=target.threads,
        quantization="none",
        compile="off",
        decode_paths="rules",
    )


def make_proposer(config: ServeConfig) -> tuple[Proposer, str]:
    """The proposer ``config.speculation`` asks for, and a one-line description.

    Raises:
        ValueError: an unknown method ("mtp" too), "draft" without a draft model, or a draft model
            whose vocabulary does not cover the target's.
        ModelLoadError: the draft model cannot be loaded.
        houchu.model.device.DeviceError: the device torch cannot use here.
    """
    spec = config.speculation
    if spec.speculative == "ngram":
        p = NgramProposer()
        return p, f"n-gram prompt lookup (n = {p.max_n} .. {p.min_n})"
    if spec.speculative != "draft":  # "mtp" proposes in the runner
        raise ValueError(f"unknown speculative method {spec.speculative!r}")
    if not spec.draft_model:
        raise ValueError("--speculative draft needs --draft-model PATH")
    from houchu.model.config.load import load_model_config
    from houchu.runner.model_runner import ModelRunner
    from houchu.speculative.draft_model import DraftModelProposer

    target = load_model_config(config.model)
    runner = ModelRunner(spec.draft_model, draft_runner_options(config.runner), quiet=True)
    p = DraftModelProposer(runner, target.vocab_size)
    used, total = p.pool_usage()
    return p, f"draft model {runner.config.name!r}: {total} pages x {p.page_size} tokens"


class DraftActor(ActorBase[DraftInbox]):
    """Answers the scheduler's requests for proposals."""

    name = "draft"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        super().__init__(ctx, config.endpoints, DraftInbox | ActorDown | ActorUp)
        self.config = config
        self.to_scheduler = self.peers.outbox("scheduler")
        self.proposer: Proposer | None = None

    async def start(self) -> str:
        self.proposer, info = make_proposer(self.config)
        return info

    async def handle(self, msg: DraftInbox) -> None:
        if isinstance(msg, DraftRequest):
            await self.to_scheduler.send(self.answer(msg))

    async def on_peer_down(self, name: str) -> None:
        if name == "scheduler":  # the new one starts from scratch
            self.proposer.release(list(self.proposer.seqs))

    def answer(self, req: DraftRequest) -> DraftReply:
        """Release, then propose; a failure becomes the reply's ``error`` (no proposals)."""
        t0 = time.perf_counter()
        p = self.proposer
        error, proposals = None, {}
        try:
            p.release(req.release)
            if req.seqs:
                proposals = p.propose(req.seqs)
        except ProtocolError as e:
            error = str(e)
        except Exception as e:  # a model failure costs proposals, never the request
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
        used, total = p.pool_usage()
        return DraftReply(
            query_id=req.query_id,
            proposals=[DraftProposal(rid, ids) for rid, ids in proposals.items()],
            duration_s=time.perf_counter() - t0,
            num_seqs=p.num_seqs,
            pages_used=used,
            pages_total=total,
            error=error,
        )
