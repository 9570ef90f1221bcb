"""A bound declared once is enforced at every edge (issue 46 item 3).

Option bounds are msgspec constraints on the option structs (``houchu.options.bounds``):
each is refused by ``houchu serve``'s parser with a line naming the flag, by an actor
decoding its ``ServeConfig``, and by ``checked`` (the model runner's one check) for a
struct built in Python. Sampling bounds are the wire's ``SamplingParams`` types
(``houchu.transport.request_fields``): each is refused by the HTTP body's decode, by an
actor decoding a ``GenerateRequest`` or ``StepPlan``, and by ``sampling_problem`` (the
sampler's one check) for parameters built in Python. The cases are read off the types, so
a bound added to a struct is tested at every edge without a new line here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec import inspect as mi

from houchu.options.bounds import checked
from houchu.options.flags import GROUPS, Flag, Group
from houchu.options.runner_options import RunnerOptions
from houchu.options.serve_config import ServeConfig
from houchu.transport.messages import GenerateRequest, SamplingParams, StepPlan
from houchu.transport.request_fields import sampling_problem
from houchu.transport.step_messages import SeqInit

MODEL = "fake-model"  # the served name the parsed bodies are checked against
MAX_CONTEXT = 1024


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    members = (
        [m for m in t.types if not isinstance(m, mi.NoneType)]
        if isinstance(t, mi.UnionType)
        else []
    )
    if len(members) == 1:  # ``X | None``
        return _unwrap(members[0])
    return t


def _outside(t: mi.Type) -> Any:
    """A value just outside ``t``'s numeric bounds (None: it has none)."""
    if isinstance(t, mi.VarTupleType):
        item = _outside(_unwrap(t.item_type))
        return None if item is None else (item, 2)
    if not isinstance(t, (mi.IntType, mi.FloatType)):
        return None
    step = 1 if isinstance(t, mi.IntType) else 0.5
    if t.ge is not None:
        return t.ge - step
    if t.gt is not None:
        return t.gt
    if t.le is not None:
        return t.le + step
    return t.lt


def _bounded_flags() -> list[tuple[Group, Flag, Any]]:
    out = []
    for group in GROUPS:
        if group.attr is None:
            continue
        fields = {f.name: f for f in mi.type_info(group.struct).fields}  # type: ignore[union-attr]
        for flag in group.flags:
            bad = _outside(_unwrap(fields[flag.field].type))
            if bad is not None:
                out.append((group, flag, bad))
    return out


BOUNDED = _bounded_flags()
IDS = [flag.name for _, flag, _ in BOUNDED]


def test_the_options_declare_bounds() -> None:
    names = set(IDS)
    assert {"--page-size", "--port", "--mem-fraction-static", "--tensor-parallel-size"} <= names
    assert {"--decode-batch-sizes", "--max-restarts", "--retention-days"} <= names


def _argv(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("group,flag,bad", BOUNDED, ids=IDS)
def test_the_cli_refuses_a_value_outside_a_flags_bounds(
    group: Group, flag: Flag, bad: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from houchu.cli.main import main

    model = tmp_path / "m.gguf"
    model.touch()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", str(model), flag.name, _argv(bad)])
    assert e.value.code == 2
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert re.match(rf"houchu serve: error: {flag.name} (items )?must ", first), first
    got = first.rpartition(", got ")[2]
    assert got == _argv(bad) if isinstance(bad, tuple) else float(got) == bad, first


@pytest.mark.parametrize("group,flag,bad", BOUNDED, ids=IDS)
def test_an_actor_decoding_its_config_refuses_it(group: Group, flag: Flag, bad: Any) -> None:
    tree = msgspec.json.decode(ServeConfig(model="/m.gguf").to_json())
    tree[group.attr][flag.field] = list(bad) if isinstance(bad, tuple) else bad
    with pytest.raises(msgspec.ValidationError, match=rf"\$\.{group.attr}\.{flag.field}"):
        ServeConfig.from_json(msgspec.json.encode(tree))


@pytest.mark.parametrize("group,flag,bad", BOUNDED, ids=IDS)
def test_a_struct_built_in_python_is_refused_by_checked(group: Group, flag: Flag, bad: Any):
    built = group.struct(**{flag.field: bad})  # msgspec does not check a constructor
    with pytest.raises(msgspec.ValidationError, match=rf"\$\.{flag.field}"):
        checked(built)


def test_the_model_runner_checks_its_options_before_loading_anything() -> None:
    from houchu.runner.model_runner import ModelRunner

    with pytest.raises(ValueError, match=r"\$\.page_size"):
        ModelRunner("/no/such/model", RunnerOptions(page_size=0), quiet=True)
    with pytest.raises(ValueError, match=r"\$\.decode_paths"):
        RunnerOptions(decode_paths="fast").checked()  # type: ignore[arg-type]


def test_a_gateway_with_a_fixed_context_below_one_is_refused() -> None:
    from houchu.transport.limits import RunnerLimits

    assert RunnerLimits.fixed(1).max_context == 1
    with pytest.raises(ValueError, match=r"\$\.max_context"):
        RunnerLimits.fixed(0)


#: (wire field, a value outside its bounds, the HTTP body's value, or None where the body
#: has no field of that meaning).
SAMPLING_OUTSIDE: list[tuple[str, Any, Any]] = [
    ("temperature", -0.5, -0.5),
    ("top_p", 1.5, 1.5),
    ("min_p", 1.5, 1.5),
    ("repetition_penalty", 0.0, 0.0),
    ("frequency_penalty", 2.5, 2.5),
    ("presence_penalty", -2.5, -2.5),
    ("top_logprobs", 21, 21),
    ("prompt_logprobs", 21, 21),
    ("min_tokens", -1, -1),
    ("max_tokens", -1, -1),
    ("logit_bias", {1: 100.5}, {"1": 100.5}),
    ("allowed_token_ids", [], []),
    ("stop_token_ids", [-1], [-1]),
    ("bad_words_ids", [[]], None),
]
SAMPLING_IDS = [f for f, _, _ in SAMPLING_OUTSIDE]


def test_every_bounded_wire_field_has_a_case() -> None:
    info = mi.type_info(SamplingParams)
    bounded = set()
    for f in info.fields:  # type: ignore[union-attr]
        t = f.type
        while isinstance(t, (mi.Metadata, mi.UnionType, mi.ListType, mi.DictType)):
            if isinstance(t, mi.ListType) and t.min_length:
                break
            if isinstance(t, mi.Metadata):
                t = t.type
            elif isinstance(t, mi.UnionType):
                t = next(m for m in t.types if not isinstance(m, mi.NoneType))
            else:
                t = t.item_type if isinstance(t, mi.ListType) else t.value_type
        if _outside(t) is not None or isinstance(t, mi.ListType):
            bounded.add(f.name)
    assert bounded == set(SAMPLING_IDS)


@pytest.mark.parametrize("field,bad,_body", SAMPLING_OUTSIDE, ids=SAMPLING_IDS)
def test_an_actor_decoding_a_request_or_plan_refuses_it(field: str, bad: Any, _body: Any):
    sampling = SamplingParams(**{field: bad})
    request = GenerateRequest(rid="r", prompt="hi", sampling=sampling)
    frame = msgspec.msgpack.encode(request)
    with pytest.raises(msgspec.ValidationError, match=rf"\$\.sampling\.{field}"):
        msgspec.msgpack.Decoder(GenerateRequest).decode(frame)
    init = [SeqInit(rid="r", sampling=sampling, prompt_ids=[1])]
    plan = StepPlan(step_id=0, init=init, work=[])
    with pytest.raises(msgspec.ValidationError, match=rf"\.sampling\.{field}"):
        msgspec.msgpack.Decoder(StepPlan).decode(msgspec.msgpack.encode(plan))


@pytest.mark.parametrize("field,bad,_body", SAMPLING_OUTSIDE, ids=SAMPLING_IDS)
def test_parameters_built_in_python_are_refused_by_the_sampler(field: str, bad: Any, _body: Any):
    from houchu.model.sampling.sampler import RequestState

    sampling = SamplingParams(**{field: bad})
    problem = sampling_problem(sampling)
    assert problem is not None and problem.startswith(field), problem
    with pytest.raises(ValueError, match=f"invalid sampling parameters: {field}"):
        RequestState("r", sampling, [1, 2], 50)


def test_parameters_within_bounds_pass_every_check() -> None:
    sampling = SamplingParams(temperature=0, top_p=1.0, top_logprobs=20, logit_bias={3: -100})
    assert sampling_problem(sampling) is None
    frame = msgspec.msgpack.encode(GenerateRequest(rid="r", prompt="hi", sampling=sampling))
    assert msgspec.msgpack.Decoder(GenerateRequest).decode(frame).sampling == sampling


BODY_CASES = [(f, b) for f, _, b in SAMPLING_OUTSIDE if b is not None]


@pytest.mark.parametrize("field,value", BODY_CASES, ids=[f for f, _ in BODY_CASES])
def test_the_http_body_refuses_it_naming_the_field(field: str, value: Any) -> None:
    from houchu.api.errors import ApiError
    from houchu.api.requests.parse import parse_chat, parse_completion

    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], field: value}
    if field == "top_logprobs":
        body["logprobs"] = True
    with pytest.raises(ApiError) as e:
        parse_chat(body, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)
    assert e.value.status == 400 and (e.value.param or "").startswith(field)
    if field != "top_logprobs":  # a chat request's own
        with pytest.raises(ApiError) as e:
            completion = {"prompt": "hi", field: value}
            parse_completion(completion, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)
        assert e.value.status == 400 and (e.value.param or "").startswith(field)


def test_the_body_and_the_wire_share_their_bounds() -> None:
    """The body's numeric bounds are the wire's (one definition), save where the OpenAI
    API's contract says otherwise: temperature's top of 2 (tighter) and top_p's 0 (sent
    as top_k 1)."""
    from houchu.api.schema.bodies import ChatCompletionRequest

    def bounds(struct: type) -> dict[str, tuple]:
        out = {}
        for f in mi.type_info(struct).fields:  # type: ignore[union-attr]
            t = _unwrap(f.type)
            if isinstance(t, (mi.IntType, mi.FloatType)) and _outside(t) is not None:
                out[f.name] = (t.ge, t.gt, t.le, t.lt)
        return out

    wire, body = bounds(SamplingParams), bounds(ChatCompletionRequest)
    shared = set(wire) & set(body)  # bounded on both sides (top_k, seed: the API's own)
    assert {"temperature", "min_p", "repetition_penalty", "top_logprobs"} <= shared
    differ = {name for name in shared if wire[name] != body[name]}
    assert differ == {"temperature", "top_p", "max_tokens"}  # OpenAI's; max_tokens: >= 1
    assert body["temperature"][:2] == wire["temperature"][:2]  # the same floor
