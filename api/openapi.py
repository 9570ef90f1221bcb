"""``GET /openapi.json``: the OpenAPI 3.1 description of the gateway's HTTP API.

The request and response schemas are generated (``msgspec.json.schema_components``) from
the msgspec types of ``api.schema`` (the requests, which the validator decodes bodies
into too) and ``api.responses``; only the paths, their status codes and media types, and
what the types cannot say, are written here. The WebSocket API (``/ws``) is not an HTTP
operation and is described in ``ws_api``'s docstring and the README. The document names
the bearer-key scheme; the key is required only when the server runs with ``--api-key``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from houchu.api.errors import json_response
from houchu.api.schema.bodies import (
    SEED_RANGE,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from houchu.api.schema.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    DetokenizeResponse,
    ErrorResponse,
    Health,
    Model,
    ModelList,
    TokenizeResponse,
)
from houchu.api.state import STATE_KEY

OPENAPI_VERSION = "3.1.0"

_ERROR_STATUSES = {
    "400": (
        "invalid request (the message and ``param`` name the problem; ``code`` is its kind: "
        "``invalid_value``, ``invalid_type``, ``unsupported_value`` (a field houchu knows "
        "but does not serve), ``invalid_grammar`` (a structured-output constraint that "
        "does not compile, matches no text or can never finish), ``grammar_too_complex`` (one the grammar engine stopped "
        "following during generation), ...)"
    ),
    "401": "missing or wrong API key (only with --api-key)",
    "404": "``model`` names a model this server does not serve (``code``: ``model_not_found``)",
    "413": "request body too large",
    "429": "the server is at capacity; retry after ``Retry-After`` seconds",
    "503": "the engine is unavailable; retry after ``Retry-After`` seconds",
}


#: Every type the document names, in ``components/schemas``.
SCHEMA_TYPES: tuple[type, ...] = (
    CompletionRequest,
    ChatCompletionRequest,
    Completion,
    ChatCompletion,
    CompletionChunk,
    ChatCompletionChunk,
    Model,
    ModelList,
    ErrorResponse,
    Health,
    TokenizeRequest,
    TokenizeResponse,
    DetokenizeRequest,
    DetokenizeResponse,
)
REQUEST_TYPES = ("CompletionRequest", "ChatCompletionRequest")
#: The request bodies: their unknown top-level keys are ignored, not refused (the
#: validator drops them before decoding, as vLLM ignores them), so the document allows
#: them; a nested object that refuses unknown keys (``StructuredOutputs``) keeps its
#: ``additionalProperties: false``.
BODY_TYPES = (*REQUEST_TYPES, "TokenizeRequest", "DetokenizeRequest")


def schema_components(
    model_name: str | None = None, max_context: int | None = None
) -> tuple[dict[str, dict], dict[str, dict]]:
    """(``{type name: $ref schema}``, ``components/schemas``) for ``SCHEMA_TYPES``.

    What the types cannot say is added to the generated schemas (the validator checks
    it by hand): the batch-of-one prompt, the seed's top, and, when given, the served
    ``model_name`` (the only value ``model`` may take) and the context window
    ``max_context`` (the largest ``max_tokens``), and the unknown top-level keys a
    request body may hold (``BODY_TYPES``).
    """
    refs, components = msgspec.json.schema_components(
        SCHEMA_TYPES, ref_template="#/components/schemas/{name}"
    )
    names = [t.__name__ for t in SCHEMA_TYPES]
    one_text = {"type": "array", "items": {"type": "string", "minLength": 1}}
    one_text.update(minItems=1, maxItems=1)
    components["CompletionRequest"]["properties"]["prompt"]["anyOf"].append(one_text)
    for name in BODY_TYPES:  # the types forbid unknown fields; the bodies do not
        components[name].pop("additionalProperties", None)
    for name in REQUEST_TYPES:
        props = components[name]["properties"]
        props["seed"]["anyOf"][0]["maximum"] = SEED_RANGE[1]
        if model_name is not None:
            props["model"]["anyOf"][0] = {"type": "string", "enum": [model_name]}
        if max_context is not None:
            for key in ("max_tokens", "max_completion_tokens"):
                if "anyOf" in props.get(key, {}):  # a completion's max_completion_tokens: null
                    props[key]["anyOf"][0]["maximum"] = max_context
    return dict(zip(names, refs, strict=True)), components


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


def _errors(refs: dict[str, dict], *statuses: str) -> dict[str, Any]:
    return {
        s: {"description": _ERROR_STATUSES[s], "content": _json(refs["ErrorResponse"])}
        for s in statuses
    }


#: The media type extension naming the JSON each server-sent event's ``data`` holds
#: (OpenAPI 3.1 has no keyword for an event stream's items).
EVENT_DATA = "x-event-data"


def _generate_op(
    refs: dict[str, dict], req: str, resp: str, chunk: str, summary: str
) -> dict[str, Any]:
    retry = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    events = {
        "schema": {
            "type": "string",
            "description": f"server-sent events: ``data: {{{chunk}}}`` per chunk, then "
            "``data: [DONE]``; an error after the stream began is a last chunk with "
            '``finish_reason: "error"``, then ``data: {ErrorResponse}`` and ``[DONE]``',
        },
        EVENT_DATA: {"oneOf": [refs[chunk], refs["ErrorResponse"]]},
    }
    responses: dict[str, Any] = {
        "200": {
            "description": "the answer; with ``stream: true`` server-sent events "
            f"(``data: {{{chunk}}}`` lines ending with ``data: [DONE]``)",
            "content": {**_json(refs[resp]), "text/event-stream": events},
        },
        **_errors(refs, "400", "401", "404", "413", "429", "503"),
    }
    responses["429"]["headers"] = retry
    responses["503"]["headers"] = retry
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(refs[req])},
        "responses": responses,
        "security": [{"bearer": []}, {}],
    }


def _post_op(refs: dict[str, dict], req: str, resp: str, summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(refs[req])},
        "responses": {
            "200": {"description": "the answer", "content": _json(refs[resp])},
            **_errors(refs, "400", "401", "404", "413", "503"),
        },
        "security": [{"bearer": []}, {}],
    }


def _get_op(summary: str, ok: dict[str, Any], *, secured: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok}}
    if secured:
        op["security"] = [{"bearer": []}, {}]
    return op


def openapi_document(model_name: str | None = None, max_context: int | None = None) -> dict:
    """The OpenAPI 3.1 document of the HTTP API (a JSON-serializable dict); with the served
    ``model_name`` and context window ``max_context`` (tokens) when given."""
    refs, schemas = schema_components(model_name, max_context)
    stats = {
        "type": "object",
        # token_path: the per-token breakdown (houchu.api.token_path); the rest counters
        "properties": {"token_path": {"type": "object"}},
        "additionalProperties": {"type": ["integer", "number", "string"]},
    }
    info = {"type": "object"}
    paths = {
        "/v1/completions": {
            "post": _generate_op(
                refs, "CompletionRequest", "Completion", "CompletionChunk", "Complete a prompt"
            )
        },
        "/v1/chat/completions": {
            "post": _generate_op(
                refs,
                "ChatCompletionRequest",
                "ChatCompletion",
                "ChatCompletionChunk",
                "Answer a conversation",
            )
        },
        "/tokenize": {
            "post": _post_op(
                refs,
                "TokenizeRequest",
                "TokenizeResponse",
                "Token ids of a prompt or of chat messages (vLLM's)",
            )
        },
        "/detokenize": {
            "post": _post_op(
                refs, "DetokenizeRequest", "DetokenizeResponse", "Text of token ids (vLLM's)"
            )
        },
        "/v1/models": {
            "get": _get_op(
                "The served model",
                {"description": "one model", "content": _json(refs["ModelList"])},
                secured=True,
            )
        },
        "/v1/models/{model}": {
            "get": {
                **_get_op(
                    "The served model by id (404 model_not_found for another id)",
                    {"description": "the model", "content": _json(refs["Model"])},
                    secured=True,
                ),
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
            }
        },
        "/health": {
            "get": {
                **_get_op(
                    "Readiness: the engine answers and its model runner is ready",
                    {"description": "ready", "content": _json(refs["Health"])},
                    secured=False,
                ),
                "responses": {
                    "200": {"description": "ready", "content": _json(refs["Health"])},
                    "503": {
                        "description": "starting, or the engine does not answer",
                        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                        "content": _json(refs["Health"]),
                    },
                },
            }
        },
        "/stats": {
            "get": _get_op(
                "Engine counters (pages, queue, in-flight requests)",
                {"description": "counters", "content": _json(stats)},
                secured=True,
            )
        },
        "/metrics": {
            "get": _get_op(
                "Prometheus metrics",
                {"description": "text exposition format", "content": {"text/plain": {}}},
                secured=True,
            )
        },
        "/version": {
            "get": _get_op(
                "houchu's version", {"description": "version", "content": _json(info)}, secured=True
            )
        },
    }
    for path, summary in (
        ("/model_info", "The served model, for routers"),
        ("/server_info", "The model, its context, the KV pool and the load, for routers"),
    ):  # also under SGLang's spellings
        op = {
            "get": _get_op(summary, {"description": "facts", "content": _json(info)}, secured=True)
        }
        paths[path] = paths[path.replace("/", "/get_", 1)] = op
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "houchu",
            "version": "1",
            "description": "OpenAI-compatible HTTP API of houchu"
            + (f", serving {model_name}" if model_name else ""),
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``."""
    state = request.app[STATE_KEY]
    limits = state.runner.current  # None while the model loads: no maximum max_tokens
    max_context = limits.max_context if limits is not None else None
    return json_response(openapi_document(state.model_name, max_context))


def add_routes(app: web.Application) -> None:
    """Register ``GET /openapi.json``."""
    app.router.add_get("/openapi.json", openapi_json)
