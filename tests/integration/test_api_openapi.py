"""``/openapi.json``: served, loadable by schemathesis, covering the app's HTTP routes, and
true to the validator (bodies generated from the schema are accepted)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from houchu.api.errors import ApiError
from houchu.api.openapi import openapi_document
from houchu.api.requests.parse import parse_chat, parse_completion
from houchu.api.tokenize import GatewayTokenizer
from tests.support.fake_api import MAX_CONTEXT, MODEL, Api, routes, serve

pytestmark = pytest.mark.slow

#: Keys no request type knows, which a body may hold (ignored, as vLLM ignores them).
UNKNOWN = {"metadata": {"k": "v"}, "x_client_trace": [1, None], "store": False}
#: (path, its body type, a minimal valid body)
BODIES = [
    ("/v1/completions", "CompletionRequest", {"prompt": "Hi", "max_tokens": 2}),
    (
        "/v1/chat/completions",
        "ChatCompletionRequest",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    ),
    ("/tokenize", "TokenizeRequest", {"prompt": "Hi"}),
    ("/detokenize", "DetokenizeRequest", {"tokens": [1, 2]}),
]

#: Rules across parameters that a JSON Schema of each field cannot state.
CROSS_FIELD_PARAMS = {
    "stream_options",
    "top_logprobs",
    "min_tokens",
    "allowed_token_ids",  # not beside a grammar
    "best_of",
    "echo",
    "continue_final_message",  # not beside add_generation_prompt: true
}
#: Fields whose text is a language of its own (a regex, a grammar, a JSON schema, tool
#: names), or whose rule spans fields (one constraint; content unless a tool call; a
#: ``tool`` turn's ``tool_call_id``):
#: checked by the validator, not by the document.
CHECKED_BEYOND_SCHEMA = re.compile(
    r"(response_format|structured_outputs|guided_\w+|regex|ebnf|tools|tool_choice"
    r"|chat_template_kwargs"
    r"|messages\[\d+\]\.(content|tool_call_id))\b"
)
PARSERS = {"/v1/completions": parse_completion, "/v1/chat/completions": parse_chat}


def integral(value: Any) -> Any:
    """``value`` with floats like 1.0 written as integers: JSON Schema's ``integer``
    admits 1.0, the gateway wants an integer literal (and takes 1 for any number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(v) for v in value]
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    return value


@pytest.fixture
async def api():
    async with serve() as a:
        yield a


async def test_document_is_served_and_names_every_http_route(api: Api) -> None:
    async with api.client.get("/openapi.json") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] == "houchu"
    http_routes = {
        (m.lower(), p)
        for m, p in routes(api.client.app)
        if m != "HEAD" and p not in ("/ws", "/openapi.json") and not p.startswith("/dashboard")
    }
    # a path parameter as the route list writes it ({model} -> 1)
    documented = {(m, re.sub(r"\{[^}]+\}", "1", p)) for p, ops in doc["paths"].items() for m in ops}
    assert http_routes == documented
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["model"]["anyOf"][0]["enum"] == [MODEL]
    assert props["max_tokens"]["anyOf"][0]["maximum"] == MAX_CONTEXT
    assert doc["components"]["schemas"]["CompletionRequest"]["required"] == ["prompt"]


def test_schemathesis_loads_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(openapi_document(MODEL, MAX_CONTEXT))
    ops = [op.ok() for op in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in ops} >= {
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
    }


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_bodies_valid_by_the_schema_pass_the_validator(path: str) -> None:
    schema = schemathesis.openapi.from_dict(openapi_document(MODEL, MAX_CONTEXT))
    op = schema[path]["POST"]
    parse = PARSERS[path]
    tried = 0

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(), _=st.just(None))
    def check(case, _) -> None:
        nonlocal tried
        tried += 1
        try:
            parsed = parse(integral(case.body), model_name=MODEL, max_context=MAX_CONTEXT)
        except ApiError as e:
            ok = e.param in CROSS_FIELD_PARAMS or CHECKED_BEYOND_SCHEMA.match(e.param or "")
            ok = ok or (e.param == "max_tokens" and case.body.get("max_tokens") == 0)  # no echo
            assert ok, (case.body, e.message)
            return
        for req in parsed.to_generates("r"):  # each choice can travel to the engine
            msgspec.msgpack.encode(req)
        # unknown top-level keys, which the document allows, change nothing
        extra = parse(integral({**UNKNOWN, **case.body}), model_name=MODEL, max_context=MAX_CONTEXT)
        assert extra.sampling == parsed.sampling

    check()
    assert tried > 50


@pytest.mark.parametrize(
    "key,value",
    [("top_k", 10**30), ("seed", 2**64), ("stop_token_ids", [2**40]), ("prompt", [2**63])],
)
def test_huge_integers_are_a_400_not_a_crash(key: str, value: Any) -> None:
    body = {"prompt": "hi", key: value}
    with pytest.raises(ApiError) as e:
        parse_completion(body, model_name=MODEL, max_context=MAX_CONTEXT)
    assert e.value.status == 400 and e.value.param == key


def test_the_logprobs_objects_are_described() -> None:
    """The completions API's legacy ``logprobs`` (with ``text_offset``) and the chat
    API's per-token entries have their own schemas, not a bare object."""
    from houchu.api.openapi import openapi_document

    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    assert set(schemas["CompletionLogprobs"]["properties"]) == {
        "tokens",
        "token_logprobs",
        "top_logprobs",
        "text_offset",
    }
    assert "top_logprobs" in schemas["ChatTokenLogprob"]["properties"]


def _validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of the document's ``components/schemas/name``."""
    doc = openapi_document(MODEL, MAX_CONTEXT)
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


@pytest.mark.parametrize(("path", "name", "body"), BODIES, ids=[b[1] for b in BODIES])
async def test_unknown_top_level_keys_are_documented_as_the_server_takes_them(
    path: str, name: str, body: dict[str, Any], real_model_path: Any
) -> None:
    """A body with keys no request type knows is valid by the document and served (the
    keys ignored); a nested object that refuses unknown keys is refused by both."""
    _validator(name).validate({**body, **UNKNOWN})
    async with serve(tokenizer=GatewayTokenizer(real_model_path)) as api:
        status, answer = await api.post(path, {**body, **UNKNOWN})
        assert status == 200, answer
        if name not in ("CompletionRequest", "ChatCompletionRequest"):
            return
        nested = {**body, "structured_outputs": {"choice": ["a"], "unknown": 1}}
        with pytest.raises(jsonschema.ValidationError):
            _validator(name).validate(nested)
        status, answer = await api.post(path, nested)
        assert status == 400 and answer["error"]["param"] == "structured_outputs", answer
