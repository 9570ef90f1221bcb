"""Structured output in the runner: grammar masks in the sampler, batched with free
requests, verified proposals (tiny random model on the real model's tokenizer)."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import torch

from houchu.api.structured.request import choice_grammar, json_schema_grammar
from houchu.model.grammar import matcher as grammar
from houchu.model.grammar.matcher import bitmask_to_allowed
from houchu.model.sampling.sampler import apply_grammar_masks
from houchu.runner.model_runner import ModelRunner
from houchu.text.tokenizer.core import TextTokenizer
from houchu.transport.messages import SamplingParams, SeqInit, StepPlan
from houchu.transport.structured import StructuredOutput
from tests.support.grammar_runner import VOCAB, run, work_item
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
JSON = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(SCHEMA))


def text_of(tok: TextTokenizer, ids: list[int]) -> str:
    assert ids and ids[-1] == 2, "the grammar ended the output with EOS"
    return tok.decode(ids[:-1])


def test_bitmask_unpacks_bit_per_token() -> None:
    bm = torch.zeros(2, 2, dtype=torch.int32)  # [R, ceil(V/32)], V = 40
    bm[0, 0] = 1 << 3
    bm[1, 1] = 1 << 7  # token 39
    bm[1, 0] = -(2**31)  # bit 31: token 31
    allowed = bitmask_to_allowed(bm, 40)
    assert allowed.shape == (2, 40)
    assert allowed[0].nonzero().flatten().tolist() == [3]
    assert allowed[1].nonzero().flatten().tolist() == [31, 39]


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_bitmask_unpacking_matches_each_bit(monkeypatch, byteorder: str) -> None:
    """numpy's byte unpacking (little-endian hosts) and the word shifts (big-endian)
    both read bit t % 32 of word t // 32 as token t."""
    monkeypatch.setattr(grammar.sys, "byteorder", byteorder)
    g = torch.Generator().manual_seed(3)
    bm = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32, generator=g)
    want = torch.tensor(
        [[(int(bm[r, t // 32]) >> (t % 32)) & 1 == 1 for t in range(150)] for r in range(3)]
    )
    assert torch.equal(bitmask_to_allowed(bm, 150), want)


@pytest.mark.parametrize("rows", [[0, 1, 2], [0, 2]])
def test_grammar_masks_leave_free_rows_and_the_input_alone(rows: list[int]) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 40, generator=g)  # [R, V]
    before = logits.clone()
    allowed = torch.rand(3, 40, generator=g) < 0.3  # [R, V] bool
    masks = [allowed[i] if i in rows else None for i in range(3)]
    out = apply_grammar_masks(logits, masks)
    assert torch.equal(logits, before)
    for i in range(3):
        want = before[i].masked_fill(~allowed[i], float("-inf")) if i in rows else before[i]
        assert torch.equal(out[i], want)


def test_the_ledger_counts_the_mask_time_not_the_forward_pass(runner) -> None:
    """Hidden mask time is the worker's time, however long the forward pass it hid
    behind took."""
    engine = runner.grammar
    engine.samples()
    g = engine.compile("led", JSON)
    job = engine.start([g], [1], [[]])
    assert job is not None
    time.sleep(0.5)  # the forward pass
    (mask,) = job.wait(VOCAB, torch.device("cpu"))
    assert mask is not None and mask.shape == (VOCAB,) and bool(mask.any())
    (sample,) = engine.samples()
    assert sample.rid == "led" and 0 < sample.saved + sample.spent < 0.4


def test_batched_masks_match_row_by_row(runner, tok) -> None:
    """llguidance's executor (one call for the rows without proposals) writes the masks
    the matchers write one by one, a finished matcher's row allowing only EOS."""
    import llguidance

    engine = runner.grammar
    choice = StructuredOutput(kind="regex", grammar=_regex("(yes|no)"))
    grammars = [engine.compile(f"q{i}", spec) for i, spec in enumerate([JSON, JSON, choice])]
    grammars[1].commit(tok.encode('{"name'))
    grammars[2].commit(tok.encode("yes"))  # done: EOS only
    rows = [grammar.MaskRow(g, i, []) for i, g in enumerate(grammars)]
    words = grammar.bitmask_words(VOCAB)
    one_by_one = torch.full((3, words), -1, dtype=torch.int32)
    for r in rows:
        r.grammar.fill(one_by_one, r.row, [])
    batched = torch.full((3, words), -1, dtype=torch.int32)
    allowed, _ = grammar._fill_all(rows, batched, VOCAB, llguidance.LLExecutor(), step=1)
    assert torch.equal(batched, one_by_one)
    assert allowed[2].nonzero().flatten().tolist() == [2]  # EOS
    assert allowed[0].sum() < VOCAB and allowed[1].sum() < VOCAB


def test_json_schema_20_seeds_validate(runner, tok) -> None:
    prompt = tok.encode("Person as JSON:")
    reqs = {
        f"r{s}": (prompt, SamplingParams(temperature=1.0, seed=s, structured=JSON))
        for s in range(20)
    }
    out = run(runner, reqs, 80)
    texts = {r: text_of(tok, ids) for r, ids in out.items()}
    for t in texts.values():
        jsonschema.validate(json.loads(t), SCHEMA)
    assert len(set(texts.values())) > 1  # the seeds differ
    samples = runner.grammar.samples()
    assert samples[0].spent_unit == "seconds"  # mask time in the ledger
    assert {x.rid for x in samples} == set(reqs)  # each request's own share
    assert all(x.saved + x.spent > 0 for x in samples)


def test_free_requests_unchanged_beside_a_constrained_one(runner, tok) -> None:
    free = {
        "g": (tok.encode("Once upon"), SamplingParams(temperature=0.0)),
        "s": (tok.encode("The sky"), SamplingParams(temperature=0.9, seed=7)),
    }
    alone = run(runner, free, 12)
    regex = StructuredOutput(kind="regex", grammar=_regex(r"[0-9]{3}-[a-z]{2}"))
    both = {**free, "c": (tok.encode("Code:"), SamplingParams(temperature=1.0, structured=regex))}
    mixed = run(runner, both, 12)
    assert {r: mixed[r] for r in free} == alone
    assert {x.rid for x in runner.grammar.samples()} == {"c"}  # the free ones have none
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text_of(tok, mixed["c"]))


def test_choice_list_constrains_exactly(runner, tok) -> None:
    from llguidance import grammar_from

    spec = StructuredOutput(kind="choice", grammar=grammar_from("choice", ["yes", "no", "maybe"]))
    reqs = {
        f"c{s}": (
            tok.encode("Answer:"),
            SamplingParams(temperature=1.5, seed=s, structured=spec),
        )
        for s in range(6)
    }
    for ids in run(runner, reqs, 10).values():
        assert text_of(tok, ids) in {"yes", "no", "maybe"}


@pytest.mark.parametrize("choices", [["", "yes", "no"], [""]])
def test_an_empty_choice_may_end_the_output_at_once(runner, tok, choices: list[str]) -> None:
    """A choice list with "" (the gateway's ``choice_grammar``) allows EOS as the first
    token: an empty output; with "" alone, EOS is the only token allowed."""
    spec = StructuredOutput(kind="choice", grammar=choice_grammar(choices))
    g = runner.grammar.compile("e", spec)
    mask = torch.zeros(1, grammar.bitmask_words(VOCAB), dtype=torch.int32)
    g.fill(mask, 0, [])
    allowed = bitmask_to_allowed(mask, VOCAB)[0].nonzero().flatten().tolist()
    assert 2 in allowed  # EOS
    assert (allowed == [2]) == (choices == [""])
    reqs = {
        f"e{s}": (
            tok.encode("Answer:"),
            SamplingParams(temperature=1.5, seed=s, structured=spec),
        )
        for s in range(4)
    }
    for ids in run(runner, reqs, 6).values():
        assert text_of(tok, ids) in choices


def test_logit_bias_on_a_forbidden_token_still_follows_the_grammar(runner, tok) -> None:
    """The logits processors run before the grammar's mask: a ``logit_bias`` that
    favours (+50) or forces (+100) tokens the grammar forbids cannot make them sampled."""
    from llguidance import grammar_from

    spec = StructuredOutput(kind="choice", grammar=grammar_from("choice", ["yes", "no"]))
    forced, favoured = tok.encode(" hello")[-1], tok.encode("{")[-1]
    reqs = {}
    for s in range(4):
        bias = {forced: 100.0} if s % 2 else {favoured: 50.0}
        sp = SamplingParams(temperature=1.0, seed=s, structured=spec, logit_bias=bias)
        reqs[f"b{s}"] = (tok.encode("Answer:"), sp)
    for ids in run(runner, reqs, 10).values():
        assert forced not in ids and favoured not in ids
        assert text_of(tok, ids) in {"yes", "no"}


def test_proposals_checked_against_the_grammar(model_dir, tok) -> None:
    """Proposals the grammar rejects are never accepted, the matcher rolls back, and a
    seeded request emits the same tokens with and without speculation."""
    prompt = tok.encode("JSON:")
    sp = SamplingParams(temperature=1.0, seed=11, structured=JSON)

    def fresh() -> ModelRunner:
        return ModelRunner(str(model_dir), exact(page_size=16, num_pages=64), quiet=True)

    plain = run(fresh(), {"a": (prompt, sp)}, 80)["a"]
    good = plain[1:4]  # what the request goes on to emit: accepted
    bad = tok.encode("hello")[:3]  # not JSON: rejected by the grammar
    assert run(fresh(), {"a": (prompt, sp)}, 80, drafts={"a": good})["a"] == plain
    assert run(fresh(), {"a": (prompt, sp)}, 80, drafts={"a": bad})["a"] == plain
    jsonschema.validate(json.loads(text_of(tok, plain)), SCHEMA)


def test_a_grammar_that_does_not_compile_fails_only_its_request(runner, tok) -> None:
    """A grammar the runner cannot compile (past the gateway's check) fails its request
    alone, as a 400 naming the field; the other request of the step goes on."""
    spec = StructuredOutput(
        kind="grammar",
        grammar='{"grammars": [{"lark_grammar": "start: x"}]}',
        param="guided_grammar",
    )
    prompt = tok.encode("Once upon")
    plan = StepPlan(
        step_id=0,
        init=[
            SeqInit(rid="a", sampling=SamplingParams(structured=spec), prompt_ids=prompt),
            SeqInit(rid="b", sampling=SamplingParams(temperature=0.0), prompt_ids=prompt),
        ],
        work=[work_item("a", prompt, 0, [0]), work_item("b", prompt, 0, [1])],
    )
    res = runner.execute(plan)
    assert set(res.failures) == {"a"}
    f = res.failures["a"]
    assert (f.status, f.code, f.param) == (400, "invalid_grammar", "guided_grammar")
    assert "'guided_grammar'" in f.message and "\n" not in f.message
    assert {o.rid for o in res.outputs} == {"a", "b"}  # the step itself went on
    assert "a" not in runner.grammars and "b" in runner.states


#: A regex llguidance compiles, whose lexer blows up once it lexes "b"s ("lexer error:
#: too many expressions constructed"): no compile-time check catches it.
LEXER_BOMB = "(a|aa)*(b|bb){1000}"


def test_a_matcher_that_stops_mid_generation_fails_only_its_request(runner, tok) -> None:
    """The matcher of a grammar llguidance cannot follow enters an error state during
    generation: the step reports a 400 for that request alone (once, naming the field),
    and the free request beside it emits what it emits alone."""
    free = {"g": (tok.encode("Once upon"), SamplingParams(temperature=0.0))}
    alone = run(runner, free, 8)
    bb = tok.encode("bb")
    assert len(bb) == 1
    spec = StructuredOutput(kind="regex", grammar=_regex(LEXER_BOMB), param="guided_regex")
    bomb = SamplingParams(temperature=0.0, structured=spec, logit_bias={bb[0]: 100.0})
    reqs = {**free, "x": (tok.encode("Letters:"), bomb)}
    pages = {"g": list(range(16)), "x": list(range(16, 32))}
    init = [SeqInit(rid=r, sampling=sp, prompt_ids=p) for r, (p, sp) in reqs.items()]
    res = runner.execute(
        StepPlan(
            step_id=0, init=init, work=[work_item(r, p, 0, pages[r]) for r, (p, _) in reqs.items()]
        )
    )
    out: dict[str, list[int]] = {r: [] for r in reqs}
    failures = {}
    for step in range(1, 8):
        failures.update(res.failures)
        for o in res.outputs:
            out[o.rid].append(o.token_id)
        live = [r for r in reqs if r not in failures]  # the scheduler drops a failed one
        work = [
            work_item(r, [out[r][-1]], len(reqs[r][0]) + len(out[r]) - 1, pages[r]) for r in live
        ]
        res = runner.execute(StepPlan(step_id=step, work=work))
    assert not res.failures  # reported once
    assert set(failures) == {"x"}
    f = failures["x"]
    assert (f.status, f.code, f.param) == (400, "grammar_too_complex", "guided_regex")
    assert "too many expressions" in f.message and "\n" not in f.message
    assert out["g"] == alone["g"][: len(out["g"])]


def _regex(pattern: str) -> str:
    from llguidance import grammar_from

    return grammar_from("regex", pattern)


def test_overlap_placeholders_keep_the_grammar_in_step(model_dir, tok) -> None:
    """With the overlap scheduler a step's input token is the runner's own last sample
    (a placeholder in the plan): the matcher has consumed it, so the output is the same."""
    prompt = tok.encode("JSON:")
    sp = SamplingParams(temperature=1.0, seed=4, structured=JSON)
    opts = exact(page_size=16, num_pages=64, jump_forward="off")  # one token per step
    want = run(ModelRunner(str(model_dir), opts, quiet=True), {"a": (prompt, sp)}, 80)["a"]
    r = ModelRunner(str(model_dir), opts, quiet=True)
    pages = list(range(16))
    init = [SeqInit(rid="a", sampling=sp, prompt_ids=prompt)]
    got = [
        r.execute(StepPlan(step_id=0, init=init, work=[work_item("a", prompt, 0, pages)]))
        .outputs[0]
        .token_id
    ]
    while got[-1] != 2 and len(got) < 80:
        w = work_item("a", [-1], len(prompt) + len(got) - 1, pages)
        w.use_last_sampled = True
        got.append(r.execute(StepPlan(step_id=len(got), work=[w])).outputs[0].token_id)
    assert got == want


@pytest.mark.parametrize("pattern", [r"[^\x00-\x{10FFFF}]", r"ab[^\x00-\x{10FFFF}]+"])
def test_a_regex_that_matches_no_text_says_so(runner, tok, pattern: str) -> None:
    """A regex that compiles but matches no text (no character is outside U+0000..
    U+10FFFF) fails its request at its first step with a 400 that says the regex
    matches no text, not that it is too complex; the free request beside it goes on."""
    spec = StructuredOutput(kind="regex", grammar=_regex(pattern), param="guided_regex")
    reqs = {
        "g": (tok.encode("Once upon"), SamplingParams(temperature=0.0)),
        "x": (tok.encode("Letters:"), SamplingParams(temperature=0.0, structured=spec)),
    }
    pages = {"g": list(range(16)), "x": list(range(16, 32))}
    init = [SeqInit(rid=r, sampling=sp, prompt_ids=p) for r, (p, sp) in reqs.items()]
    work = [work_item(r, p, 0, pages[r]) for r, (p, _) in reqs.items()]
    res = runner.execute(StepPlan(step_id=0, init=init, work=work))
    assert set(res.failures) == {"x"}
    f = res.failures["x"]
    assert (f.status, f.code, f.param) == (400, "invalid_grammar", "guided_regex")
    assert f.message.startswith("'guided_regex' matches no text")
    assert "too complex" not in f.message
    assert "g" in {o.rid for o in res.outputs}
