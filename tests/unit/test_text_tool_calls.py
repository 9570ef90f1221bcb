"""Tool-call parsing: whole replies and streams (split anywhere) of each format, and the
chat formatter's tool_calls."""

from __future__ import annotations

import json

import msgspec
import pytest
from llguidance import LLMatcher, LLTokenizer

from houchu.api.openai.format import ChatFormatter, Tally
from houchu.api.requests.tools import ToolSetup, tool_setup
from houchu.api.schema.bodies import ChatCompletionRequest
from houchu.text.tool_calls.parse import (
    FirstCallParser,
    ForcedCallParser,
    RequiredCallsParser,
    ToolCallParser,
    make_parser,
)
from houchu.transport.messages import TextDelta

HERMES = (
    'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    '</tool_call>\n<tool_call>{"name": "time", "arguments": {}}</tool_call>'
)
CASES = [
    ("hermes", HERMES, "Let me check. \n", [("get_weather", {"city": "Paris"}), ("time", {})]),
    ("hermes", "No call here, <tool > tag.", "No call here, <tool > tag.", []),
    ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]',
        None,
        [("f", {"x": 1}), ("g", {})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
        None,
        [("f", {"x": 1}), ("g", {})],
    ),
    ("llama3_json", "Hello there.", "Hello there.", []),
]


def _calls(calls) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def _stream(parser: ToolCallParser, text: str, step: int) -> tuple[str, list[tuple[str, object]]]:
    """Feed ``text`` in pieces of ``step`` characters; reassemble content and calls."""
    s = parser.stream()
    content, calls = "", {}
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for d in [*(s.feed(p) for p in pieces), s.finish()]:
        content += d.content
        for t in d.tool_calls:
            c = calls.setdefault(t["index"], {"name": "", "arguments": ""})
            c["name"] += t.get("function", {}).get("name", "")
            c["arguments"] += t["function"].get("arguments", "")
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_whole_reply(parser, text, content, calls) -> None:
    parsed = make_parser(parser).parse(text)
    assert parsed.content == content and _calls(parsed.calls) == calls


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_stream_reassembles_to_the_whole_reply(parser, text, content, calls, step) -> None:
    got_content, got_calls = _stream(make_parser(parser), text, step)
    assert got_content == (content or "") and got_calls == calls


def test_forced_and_required_forms() -> None:
    forced = ForcedCallParser("get_weather")
    assert _calls(forced.parse('{"city": "Oslo"}').calls) == [("get_weather", {"city": "Oslo"})]
    assert _stream(forced, '{"city": "Oslo"}', 2) == ("", [("get_weather", {"city": "Oslo"})])
    req = RequiredCallsParser()
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    assert _calls(req.parse(text).calls) == [("a", {"x": 1}), ("b", {})]
    assert _stream(req, text, 5) == ("", [("a", {"x": 1}), ("b", {})])


CUT_REQUIRED = '[{"name": "a", "parameters": {"x": 1}}, {"name": "get_weather", "parameters": {"ci'


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_cut_required_reply_is_its_calls_as_a_cut_named_one_is(step: int) -> None:
    """Cut by ``max_tokens``, ``required`` and a named ``tool_choice`` both give calls
    whose last ``arguments`` are the text as far as it got, whole and streamed."""
    whole = RequiredCallsParser().parse(CUT_REQUIRED)
    want = [("a", '{"x": 1}'), ("get_weather", '{"ci')]
    assert whole.content is None and [(c.name, c.arguments) for c in whole.calls] == want
    named = ForcedCallParser("get_weather").parse('{"ci')
    assert named.content is None and [(c.name, c.arguments) for c in named.calls] == want[1:]
    s = RequiredCallsParser().stream()
    pieces = [CUT_REQUIRED[i : i + step] for i in range(0, len(CUT_REQUIRED), step)]
    calls: dict[int, list[str]] = {}
    for d in [*(s.feed(p) for p in pieces), s.finish()]:
        assert d.content == ""
        for t in d.tool_calls:
            c = calls.setdefault(t["index"], ["", ""])
            c[0] += t["function"].get("name", "")
            c[1] += t["function"]["arguments"]
    assert [tuple(c) for c in calls.values()] == want


@pytest.mark.parametrize(
    "text", ["[", "[{", '[{"name": "get_wea', '[{"name": "get_weather", "x', " [ ", "x"]
)
@pytest.mark.parametrize("step", [1, 2, 1000])
def test_a_required_reply_never_gives_its_markup_as_content(text: str, step: int) -> None:
    """A ``required`` reply cut before its first call's name is complete (by
    ``max_tokens``), or one that is not an array of calls, has no call and no content:
    the grammar's array markup is never the reply's content, whole or streamed."""
    whole = RequiredCallsParser().parse(text)
    assert (whole.content, whole.calls) == (None, [])
    s = RequiredCallsParser().stream()
    deltas = [*(s.feed(text[i : i + step]) for i in range(0, len(text), step)), s.finish()]
    assert [(d.content, d.tool_calls) for d in deltas if d.content or d.tool_calls] == []


@pytest.mark.parametrize(
    "cut",
    [
        '[{"name": "get_weather"',
        '[{"name": "get_weather",',
        '[{"name": "get_weather", "par',
        '[{"name": "get_weather", "parameters"',
        '[{"name": "get_weather", "parameters": ',
    ],
)
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_required_call_cut_right_after_its_name_is_a_call(cut: str, step: int) -> None:
    """Cut by ``max_tokens`` once the name is complete but before its arguments start,
    a ``required`` call is still a call (its name, empty arguments), not the wrapper's
    text as content; whole and streamed alike."""
    for text in (cut, '[{"name": "a", "parameters": {}}, ' + cut[1:]):
        whole = RequiredCallsParser().parse(text)
        assert whole.content is None, text
        assert (whole.calls[-1].name, whole.calls[-1].arguments) == ("get_weather", "")
        s = RequiredCallsParser().stream()
        deltas = [*(s.feed(text[i : i + step]) for i in range(0, len(text), step)), s.finish()]
        assert "".join(d.content for d in deltas) == ""
        streamed = [t["function"] for d in deltas for t in d.tool_calls]
        assert [(f["name"], f["arguments"]) for f in streamed] == [
            (c.name, c.arguments) for c in whole.calls
        ]


def test_chat_formatter_cut_call_is_a_call_with_finish_reason_length() -> None:
    fmt = ChatFormatter("r", 0, "m", logprobs=False, top_n=0, tool_parser=RequiredCallsParser())
    tally = Tally()
    tally.add(TextDelta(rid="r", text=CUT_REQUIRED, finish_reason="length"))
    choice = fmt.response(tally)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == [
        '{"x": 1}',
        '{"ci',
    ]
    tally = Tally()
    tally.add(TextDelta(rid="r", text='[{"name": "get_weather",', finish_reason="length"))
    choice = fmt.response(tally)["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("length", None)
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": ""}


def test_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="hermes"):
        make_parser("nope")


def test_chat_formatter_tool_calls_and_finish_reason() -> None:
    fmt = ChatFormatter("r", 0, "m", logprobs=False, top_n=0, tool_parser=make_parser("hermes"))
    tally = Tally()
    tally.add(TextDelta(rid="r", text=HERMES, finish_reason="stop"))
    choice = fmt.response(tally)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check. \n"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == [
        "get_weather",
        "time",
    ]
    stream = ChatFormatter("r", 0, "m", logprobs=False, top_n=0, tool_parser=make_parser("hermes"))
    chunks = [*stream.content_chunks(HERMES[:20], None), *stream.content_chunks(HERMES[20:], None)]
    chunks += stream.finish_chunks("stop")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert first["id"].startswith("call_") and first["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    plain = ChatFormatter("r", 0, "m", logprobs=False, top_n=0)
    assert plain.response(tally)["choices"][0]["message"] == {
        "role": "assistant",
        "content": HERMES,
    }


def test_chat_formatter_parses_each_choice_on_its_own() -> None:
    """n > 1: interleaved deltas of two choices; each choice's tool-call deltas and
    finish reason carry its own ``index`` and come from its own parser."""
    fmt = ChatFormatter("r", 0, "m", logprobs=False, top_n=0, tool_parser=make_parser("hermes"))
    plain = "No call here."
    chunks = []
    for k in range(0, max(len(HERMES), len(plain)), 7):
        chunks += fmt.content_chunks(HERMES[k : k + 7], None, 0) if HERMES[k:] else []
        chunks += fmt.content_chunks(plain[k : k + 7], None, 1) if plain[k:] else []
    chunks += fmt.finish_chunks("stop", 1) + fmt.finish_chunks("stop", 0)
    by_index: dict[int, list[dict]] = {0: [], 1: []}
    for c in chunks:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    names = [
        t["function"]["name"]
        for ch in by_index[0]
        for t in ch["delta"].get("tool_calls", [])
        if t.get("function", {}).get("name")
    ]
    assert names == ["get_weather", "time"]
    assert by_index[0][-1]["finish_reason"] == "tool_calls"
    assert not any("tool_calls" in ch["delta"] for ch in by_index[1])
    assert "".join(ch["delta"].get("content", "") for ch in by_index[1]) == plain
    assert by_index[1][-1]["finish_reason"] == "stop"
    tallies = [Tally(), Tally()]
    tallies[0].add(TextDelta(rid="r-0", text=HERMES, finish_reason="stop"))
    tallies[1].add(TextDelta(rid="r-1", text=plain, finish_reason="stop"))
    out = fmt.response(tallies)["choices"]
    assert [c["finish_reason"] for c in out] == ["tool_calls", "stop"]
    assert len(out[0]["message"]["tool_calls"]) == 2 and "tool_calls" not in out[1]["message"]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_parallel_tool_calls_false_returns_the_first_call(step: int) -> None:
    """``parallel_tool_calls: false`` with ``auto``: the first call the model wrote,
    whole and streamed (OpenAI's "at most one call"), and nothing after it: a second
    call, whole or cut by max_tokens, is not content either."""
    first = FirstCallParser(make_parser("hermes"))
    cut = HERMES[: HERMES.index('"time"') + 4]  # the second call cut mid-name
    for reply in (HERMES, cut):
        parsed = first.parse(reply)
        assert parsed.content == "Let me check. "
        assert _calls(parsed.calls) == [("get_weather", {"city": "Paris"})]
        assert _stream(first, reply, step) == ("Let me check. ", _calls(parsed.calls))


def _chat_tools(extra: dict) -> ToolSetup:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL], **extra}
    setup = tool_setup(msgspec.convert(body, ChatCompletionRequest))
    assert setup is not None
    return setup


def _follows(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher (on a byte tokenizer) takes ``text`` whole."""
    m = LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


def test_parallel_tool_calls_false_makes_required_one_call() -> None:
    one = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    two = one[:-1] + ", " + one[1:]
    free = _chat_tools({"tool_choice": "required"})
    single = _chat_tools({"tool_choice": "required", "parallel_tool_calls": False})
    assert free.structured is not None and single.structured is not None
    assert _follows(free.structured.grammar, one) and _follows(free.structured.grammar, two)
    assert _follows(single.structured.grammar, one)
    assert not _follows(single.structured.grammar, two)
    assert isinstance(_chat_tools({"parallel_tool_calls": False}).parser("hermes"), FirstCallParser)
    assert not isinstance(_chat_tools({}).parser("hermes"), FirstCallParser)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_parallel_tool_calls_false_skips_a_block_that_is_no_call(step: int) -> None:
    """A marked block that does not parse stays content, and the reply ends after the
    first real call (whole and streamed, in pieces of any size)."""
    first = FirstCallParser(make_parser("hermes"))
    reply = (
        'a <tool_call>not json</tool_call> b <tool_call>{"name": "x", "arguments": {}}'
        '</tool_call> tail <tool_call>{"name": "y", "arg'
    )
    parsed = first.parse(reply)
    assert parsed.content == "a <tool_call>not json</tool_call> b "
    assert _calls(parsed.calls) == [("x", {})]
    assert _stream(first, reply, step) == (parsed.content, _calls(parsed.calls))


UNKNOWN = [
    (
        "hermes",
        'Sure. <tool_call>{"name": "launch", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
        'Sure. <tool_call>{"name": "launch", "arguments": {}}</tool_call>',
        [("f", {"x": 1})],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "launch", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "launch", "arguments": {}}]',
        [],
    ),
    (
        "llama3_json",
        '{"name": "launch", "parameters": {}}',
        '{"name": "launch", "parameters": {}}',
        [],
    ),
]


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(("parser", "text", "content", "calls"), UNKNOWN)
def test_a_call_to_a_function_not_in_tools_stays_content(parser, text, content, calls, step):
    """``auto``: a call naming a function the request did not offer is not returned as a
    call (the client could not run it); its text stays in the content, whole and
    streamed. Without the request's names the same text is a call."""
    known = frozenset({"f", "g"})
    parsed = make_parser(parser, known).parse(text)
    assert parsed.content == content and _calls(parsed.calls) == calls
    assert _stream(make_parser(parser, known), text, step) == (content, calls)
    assert make_parser(parser).parse(text).calls  # any name: a call


def test_the_auto_parser_of_a_request_knows_its_tool_names() -> None:
    setup = _chat_tools({})
    assert setup.names == frozenset({"get_weather"})
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert setup.parser("hermes").parse(text).calls == []
    first = _chat_tools({"parallel_tool_calls": False}).parser("hermes")
    assert first.parse(text).calls == [] and first.parse(text).content == text
