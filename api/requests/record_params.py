"""A request's parameters as the dashboard's request view records them: flat and short.

Every value is an int, float or str (telemetry event data). Defaults are left out, so
a request shows what it asked for. Lists are shown by their length and first entries
(``listed``), never in full; text the client wrote (``bad_words``) only by its count.
Tool names and stop strings, which a client's application chose, are kept under
``PRIVATE_KEYS``: the gateway drops them when it keeps no prompt previews (an API key
guards the APIs).

``sampling_record`` reads a ``SamplingParams``; ``tools_record`` a ``ToolSetup``-like
object; ``template_record`` the chat-template fields a client sent; ``choice_record``
the choice of a several-choice request (``n``, ``best_of``) from its wire request's
``prefill_group``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from houchu.transport.messages import GenerateRequest
from houchu.transport.request_fields import SamplingParams

#: A recorded parameter's value.
Value = float | int | str
#: Entries of a list shown before the ellipsis.
SHOWN = 4
#: Longest recorded string value, characters.
MAX_CHARS = 200
#: Keys dropped when the gateway records no prompt previews.
PRIVATE_KEYS = ("tool_names", "tool_choice_name", "stop")


def first(items: Sequence[object]) -> str:
    """The first ``SHOWN`` entries, e.g. ``"13, 198, 50256, 7, …"``."""
    more = ", …" if len(items) > SHOWN else ""
    return (", ".join(str(x) for x in items[:SHOWN]) + more)[:MAX_CHARS]


def listed(items: Sequence[object]) -> str:
    """``"<count>: <first SHOWN>"``, e.g. ``"5: 13, 198, 50256, 7, …"``."""
    return f"{len(items)}: {first(items)}"[:MAX_CHARS]


def shape_record(messages: Sequence[object] | None, s: SamplingParams) -> dict[str, Value]:
    """``api`` (chat or completion), the sampling parameters (``sampling_record``) and a
    chat's number of ``messages``: what every request's record starts with."""
    out: dict[str, Value] = {"api": "chat" if messages is not None else "completion"}
    out.update(sampling_record(s))
    if messages is not None:
        out["messages"] = len(messages)
    return out


def sampling_record(s: SamplingParams) -> dict[str, Value]:
    """The sampling parameters of ``s`` (the defaults of the optional ones left out)."""
    out: dict[str, Value] = {
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "ignore_eos": int(s.ignore_eos),
    }
    for name in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        v = getattr(s, name)
        if v != (1.0 if name == "repetition_penalty" else 0.0):
            out[name] = v
    if s.seed is not None:
        out["seed"] = s.seed
    if s.stop:
        out["stop"] = " | ".join(s.stop)[:MAX_CHARS]
    if s.logprobs:  # completions' logprobs N, chat's logprobs + top_logprobs N
        out["logprobs"] = 1
        out["top_logprobs"] = s.top_logprobs
    if s.prompt_logprobs is not None:
        out["prompt_logprobs"] = s.prompt_logprobs
    if s.echo:
        out["echo"] = 1
    if s.min_tokens:
        out["min_tokens"] = s.min_tokens
    if s.stop_token_ids:
        out["stop_token_ids"] = listed(s.stop_token_ids)
    if s.allowed_token_ids is not None:
        out["allowed_token_ids"] = listed(s.allowed_token_ids)
    if s.logit_bias:
        out["logit_bias"] = listed([f"{t}={b:+g}" for t, b in s.logit_bias.items()])
    if s.bad_words:
        out["bad_words"] = len(s.bad_words)
    if s.include_stop_str_in_output:
        out["include_stop_str_in_output"] = 1
    if s.structured is not None:  # the grammar's form, for the dashboard's request view
        out["grammar"] = s.structured.kind
        if s.structured.param:
            out["grammar_from"] = s.structured.param
    return out


class ToolsLike(Protocol):
    """What ``tools_record`` reads of ``houchu.api.requests.tools.ToolSetup``."""

    choice: str
    name: str | None
    template_tools: list[dict] | None
    single: bool
    names: frozenset[str]


def tools_record(setup: ToolsLike) -> dict[str, Value]:
    """``tools`` (their count), ``tool_names`` (the first ones), ``tool_choice`` (none,
    auto, required or named), ``tool_choice_name`` (the named function) and
    ``parallel_tool_calls`` (0 when false)."""
    if setup.template_tools:
        names = [t["function"]["name"] for t in setup.template_tools]
    else:  # tool_choice none: the template is given none
        names = sorted(setup.names)
    out: dict[str, Value] = {"tools": len(names), "tool_choice": setup.choice}
    if names:
        out["tool_names"] = first(names)
    if setup.name is not None:
        out["tool_choice_name"] = setup.name
    if setup.single:
        out["parallel_tool_calls"] = 0
    return out


def template_record(
    kwargs: Mapping[str, Any] | None,
    add_generation_prompt: bool | None,
    continue_final_message: bool | None,
) -> dict[str, Value]:
    """The chat-template fields as the client sent them (a field left out is not
    recorded): ``chat_template_kwargs`` (its keys, ``listed``; a number's, boolean's or
    null's value beside its key, e.g. ``"1: enable_thinking=false"``; text the client
    wrote only by its key), ``add_generation_prompt`` and ``continue_final_message``
    (1 or 0)."""
    out: dict[str, Value] = {}
    if kwargs is not None:
        out["chat_template_kwargs"] = listed([_kwarg(k, v) for k, v in kwargs.items()])
    for name, given in (
        ("add_generation_prompt", add_generation_prompt),
        ("continue_final_message", continue_final_message),
    ):
        if given is not None:
            out[name] = int(given)
    return out


def _kwarg(key: str, value: Any) -> str:
    """``key=value`` for a scalar that is not text, else ``key``."""
    if value is None or isinstance(value, bool | int | float):
        return f"{key}={json.dumps(value)}"
    return key


def choice_record(req: GenerateRequest) -> dict[str, Value]:
    """The choice ``req`` is of a several-choice request: ``parent`` (the client
    request's id), ``choice`` (its index) and ``choices`` (how many were generated);
    empty for a request of one choice. Choice ids are ``<parent>-<index>``
    (``ParsedRequest.to_generates``)."""
    group = req.prefill_group
    if not group:
        return {}
    out: dict[str, Value] = {"parent": group, "choices": req.prefill_group_size}
    tail = req.rid[len(group) + 1 :] if req.rid.startswith(f"{group}-") else ""
    if tail.isdigit():
        out["choice"] = int(tail)
    return out
