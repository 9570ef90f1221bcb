"""Text a grammar forces that is also a special token's text (``<|im_end|>``) comes
out as ordinary tokens, as any other text does (``houchu.model.grammar.tokenizer``):
before, llguidance tokenized it into the special token and the request failed with
a misleading "too complex" 400."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import msgspec
import pytest

from houchu.api.requests.tools import tool_setup
from houchu.api.schema.bodies import ChatCompletionRequest
from houchu.api.structured.request import choice_grammar, json_schema_grammar
from houchu.model.grammar.tokenizer import GrammarTokenizer
from houchu.runner.model_runner import ModelRunner
from houchu.text.tokenizer.core import TextTokenizer
from houchu.transport.messages import SamplingParams
from houchu.transport.structured import StructuredOutput
from tests.support.grammar_runner import VOCAB, run

pytestmark = pytest.mark.slow

ENUM_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"s": {"enum": ["<|im_end|>"]}},
            "required": ["s"],
            "additionalProperties": False,
        },
    },
}


def _tool_grammar() -> str:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [ENUM_TOOL]}
    named = {"type": "function", "function": {"name": "f"}}
    req = msgspec.convert({**body, "tool_choice": named}, ChatCompletionRequest)
    setup = tool_setup(req)
    assert setup is not None and setup.structured is not None
    return setup.structured.grammar


#: (the grammar's form, its grammar, the only text it allows)
FORCED = [
    ("choice", lambda: choice_grammar(["<|im_end|>"]), "<|im_end|>"),
    ("regex", lambda: llguidance.grammar_from("regex", r"<\|im_end\|>"), "<|im_end|>"),
    (
        "json_schema",
        lambda: json_schema_grammar(
            {
                "type": "object",
                "properties": {"t": {"const": "<|endoftext|>"}},
                "required": ["t"],
                "additionalProperties": False,
            }
        ),
        '{"t": "<|endoftext|>"}',
    ),
    ("tool_call", _tool_grammar, '{"s": "<|im_end|>"}'),
]


@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump-forward", "step-by-step"])
@pytest.mark.parametrize(("kind", "build", "text"), FORCED, ids=[f[0] for f in FORCED])
def test_forced_special_token_text_comes_out_as_text(
    runner: ModelRunner, tok: TextTokenizer, kind: str, build, text: str, jump_forward: bool
) -> None:
    """The output is the grammar's text, in ordinary tokens, then EOS; with logprobs
    (no jump-forward: the forced tokens are sampled one by one) too."""
    spec = StructuredOutput(kind=kind, grammar=build(), param="guided_choice")  # type: ignore[arg-type]
    sp = SamplingParams(temperature=1.0, seed=3, structured=spec, logprobs=not jump_forward)
    out = run(runner, {"a": (tok.encode("Say it:"), sp)}, 40)["a"]
    assert out[-1] == 2 and not any(tok.is_special(t) for t in out[:-1]), out
    assert tok.decode(out[:-1]) == text
    if kind in ("json_schema", "tool_call"):
        json.loads(tok.decode(out[:-1]))


def test_special_tokens_stay_special(real_model_path: Path) -> None:
    """The grammar tokenizer tokenizes special-token text as text, yet its special tokens
    are still special (never in a text's mask), a Lark grammar still names them, and
    the model's rows past the tokenizer's vocabulary are never text."""
    lt = GrammarTokenizer(real_model_path, VOCAB + 64).get()
    assert lt.vocab_size == VOCAB + 64
    ids = lt.tokenize_str("<|im_end|> and <|endoftext|>")
    assert not any(lt.is_special_token(t) for t in ids)
    assert lt.decode_str(ids) == "<|im_end|> and <|endoftext|>"
    assert lt.is_special_token(2) and lt.is_special_token(0)
    lark = llguidance.LLMatcher(lt, llguidance.grammar_from("lark", 'start: "hi" <|im_end|>'))
    assert not lark.is_error()
    assert lark.consume_tokens(lt.tokenize_str("hi")) and lark.consume_token(2)
    assert lark.is_accepting()
    text = llguidance.LLMatcher(lt, choice_grammar(["<|im_end|>"]))
    assert not text.consume_token(2)  # the special token is not the text
