"""The draft actor's answers (no sockets needed beyond binding its inbox) and the choice
of proposer from the serving configuration."""

from __future__ import annotations

import pytest
import zmq.asyncio

from houchu.actors.draft import DraftActor, make_proposer
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.options.runner_options import RunnerOptions
from houchu.options.serve_config import Launch, ServeConfig
from houchu.options.speculation_options import SpeculativeOptions
from houchu.speculative.draft_model import DraftModelProposer
from houchu.transport.endpoints import Endpoints
from houchu.transport.spec_messages import DraftRequest, DraftSeq


def config(tmp_path, runner: RunnerOptions | None = None, **spec) -> ServeConfig:
    return ServeConfig(
        model=str(tmp_path),
        runner=runner or RunnerOptions(),
        speculation=SpeculativeOptions(**spec),
        launch=Launch(endpoints=Endpoints.inproc("spec-test")),
    )


def test_ngram_actor_answers_syncs_and_releases(tmp_path):
    ctx = zmq.asyncio.Context()
    actor = DraftActor(ctx, config(tmp_path, speculative="ngram"))
    try:
        make = make_proposer(actor.config)
        actor.proposer = make[0]
        assert "n-gram" in make[1]
        seq = DraftSeq("a", 0, [1, 2, 3, 4, 1, 2], 2)
        reply = actor.answer(DraftRequest(query_id=7, seqs=[seq]))
        assert reply.query_id == 7 and reply.error is None and reply.num_seqs == 1
        assert [(p.rid, p.token_ids) for p in reply.proposals] == [("a", [3, 4])]
        bad = actor.answer(DraftRequest(query_id=8, seqs=[DraftSeq("a", 99, [5], 1)]))
        assert bad.error and not bad.proposals
        gone = actor.answer(DraftRequest(query_id=9, release=["a"]))
        assert gone.num_seqs == 0 and gone.error is None
    finally:
        ctx.destroy(linger=0)


def test_draft_proposer_needs_a_model_sharing_the_vocabulary(tmp_path):
    target = make_tiny_llama(tmp_path / "t", seed=1)
    with pytest.raises(ValueError, match="--draft-model"):
        make_proposer(config(target, speculative="draft"))
    small = make_tiny_llama(tmp_path / "s", seed=2, vocab_size=64)
    with pytest.raises(ValueError, match="vocabulary"):
        make_proposer(config(target, speculative="draft", draft_model=str(small)))
    runner = RunnerOptions(num_pages=8, page_size=4)
    p, info = make_proposer(config(target, runner, speculative="draft", draft_model=str(target)))
    assert isinstance(p, DraftModelProposer) and p.pool_usage() == (0, 8) and "8 pages" in info
