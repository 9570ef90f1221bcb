"""Proposals that complete the grammar and then end the output (``}`` then EOS, as an
n-gram proposer copies them from the prompt) leave the matcher where it was
(``houchu.model.grammar.matcher.RequestGrammar.fill``).

llguidance takes EOS at a stop without recording it, so rolling back every proposal
the grammar validated undid one real token too many: the next commit failed on a token
its mask had allowed, and the request ended with a false ``grammar_too_complex`` 400
(seen with ``--speculative ngram``: "token "}" doesn't satisfy the grammar").
"""

from __future__ import annotations

import pytest
import torch

from houchu.api.structured.request import choice_grammar, json_schema_grammar
from houchu.model.grammar.matcher import bitmask_to_allowed, bitmask_words
from houchu.runner.model_runner import ModelRunner
from houchu.text.tokenizer.core import TextTokenizer
from houchu.transport.messages import SamplingParams, SeqInit, StepPlan
from houchu.transport.structured import StructuredOutput
from tests.support.grammar_runner import VOCAB, work_item

pytestmark = pytest.mark.slow

EOS = 2
ITEM = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": ITEM, "maxItems": 8}},
    "required": ["items"],
    "additionalProperties": False,
}


def _ids(runner: ModelRunner, text: str) -> list[int]:
    """``text`` in the grammar tokenizer's tokens."""
    return list(runner.grammar.tokenizer.get().tokenize_str(text))


@pytest.mark.parametrize(
    ("prefix", "drafts"),
    [
        ('{"items": [{"n": 1', ["4", "}", "]}", EOS]),  # the failure seen in the server
        ('{"items": [{"n": 1', ["}", "]}", EOS, EOS]),
        ('{"items": [{"n": 1}', ["]}", EOS]),
    ],
    ids=["rejected-first", "accepted-then-eos", "eos-right-after-stop"],
)
def test_proposals_ending_the_output_roll_back_exactly(
    runner: ModelRunner, prefix: str, drafts: list[str | int]
) -> None:
    """After filling the masks of proposals that complete the grammar and add EOS, the
    matcher is where it was: each token row 0 allows commits, and the row after the
    EOS proposal allows only EOS."""
    spec = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(ITEMS))
    d = [t if isinstance(t, int) else _ids(runner, t)[0] for t in drafts]
    for allowed_next in ("}", "]}", "4"):
        g = runner.grammar.compile("a", spec)
        g.commit(_ids(runner, prefix))
        assert g.consumed == len(_ids(runner, prefix)) and not g.matcher.is_error()
        bitmask = torch.full((len(d) + 1, bitmask_words(VOCAB)), -1, dtype=torch.int32)
        g.fill(bitmask, 0, d)
        rows = bitmask_to_allowed(bitmask, VOCAB)  # [len(d) + 1, V]
        tok_next = _ids(runner, allowed_next)[0]
        if not rows[0, tok_next]:
            continue  # not a continuation here ("4" after "}")
        after_eos = d.index(EOS) + 1  # the row after the first EOS proposal
        assert rows[after_eos].nonzero().flatten().tolist() == [EOS]
        g.commit([tok_next])
        assert g.failure() is None, f"{allowed_next!r} was allowed, yet the commit failed"
        assert g.consumed == len(_ids(runner, prefix)) + 1


def test_verified_proposals_through_the_grammar_stop_fail_nothing(
    runner: ModelRunner, tok: TextTokenizer
) -> None:
    """A verified step whose proposals close the choice and add EOS (``}`` EOS after
    ``1``): whatever the model samples at the first row ("}" then EOS, or "2" and the
    "}" jump-forward forces), the request does not fail and its matcher took every
    token."""
    spec = StructuredOutput(kind="choice", grammar=choice_grammar(["1}", "12}"]))
    prompt = tok.encode("Pick:")
    one, close = _ids(runner, "1")[0], _ids(runner, "}")[0]
    for seed in range(6):
        sp = SamplingParams(temperature=1.5, seed=seed, structured=spec, max_tokens=8)
        res = runner.execute(
            StepPlan(
                step_id=0,
                init=[SeqInit(rid="a", sampling=sp, prompt_ids=prompt)],
                work=[work_item("a", prompt, 0, [0])],
            )
        )
        assert [o.token_id for o in res.outputs] == [one] and not res.failures
        work = work_item("a", [one, close, EOS], len(prompt), [0], num_draft=2)
        res = runner.execute(StepPlan(step_id=1, work=[work]))
        out = [one, *(o.token_id for o in res.outputs)]
        assert not res.failures, res.failures["a"].message
        out = out[: out.index(EOS) + 1] if EOS in out else out  # the output ends there
        g = runner.grammars["a"]
        assert g.consumed == len(out) - (out[-1] == EOS) and not g.matcher.is_error()
        text = tok.decode([t for t in out if t != EOS])
        assert text in {"1}", "12}"} if out[-1] == EOS else "12}".startswith(text), out
        runner.execute(StepPlan(step_id=2, work=[], release=["a"]))
