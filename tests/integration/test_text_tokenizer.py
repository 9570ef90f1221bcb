"""The real model's tokenizer: encoding, chat template, EOS ids, token bytes, HF directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from houchu.text.tokenizer.core import TextTokenizer, TokenizerError, load_tokenizer, reads_variable
from houchu.transport.messages import ChatMessage

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello, world!",
    "你好世界",
    "👩‍👩‍👧 🎉 emoji",
    "def f(x):\n    return x  # two  spaces\n\n\ttab",
    "mixed: naïve café — 日本語 and ελληνικά ✓",
    " leading and trailing spaces ",
    "",
]


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


@pytest.fixture(scope="module")
def hf(real_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    path = Path(real_model_path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def conversations() -> list[list[ChatMessage]]:
    return [
        [ChatMessage("user", "What is 2+2?")],
        [ChatMessage("system", "You are terse."), ChatMessage("user", "Hi 你好 🎉")],
        [
            ChatMessage("user", "Name a colour."),
            ChatMessage("assistant", "Blue."),
            ChatMessage("user", "Another one?"),
        ],
    ]


def hf_chat_ids(hf: Any, messages: list[ChatMessage]) -> list[int]:
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    out = hf.apply_chat_template(conversation, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_metadata(tok: TextTokenizer) -> None:
    assert tok.name == "SmolLM2-135M-Instruct.Q4_1"
    assert tok.eos_token_ids == [2]
    assert tok.vocab_size == 49152
    assert tok.add_bos is False
    assert tok.bos_token_id == 1
    assert {0, 1, 2} <= tok.special_ids
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_hf_and_round_trips(tok: TextTokenizer, hf: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_encode_parses_special_token_text(tok: TextTokenizer) -> None:
    assert tok.encode("<|im_start|>user") == [1, 4093]


@pytest.mark.parametrize("index", range(3))
def test_chat_template_matches_hf(tok: TextTokenizer, hf: Any, index: int) -> None:
    messages = conversations()[index]
    ids = tok.apply_chat_template(messages)
    assert ids == hf_chat_ids(hf, messages)
    assert ids[-4:] == tok.encode("<|im_start|>assistant\n")


def test_chat_template_system_message(tok: TextTokenizer) -> None:
    text = tok.render_chat([ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    default = tok.render_chat([ChatMessage("user", "Hi")])
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_developer_role_is_system(tok: TextTokenizer) -> None:
    dev = tok.apply_chat_template([ChatMessage("developer", "X"), ChatMessage("user", "Y")])
    sys = tok.apply_chat_template([ChatMessage("system", "X"), ChatMessage("user", "Y")])
    assert dev == sys


def test_chat_template_errors(tok: TextTokenizer) -> None:
    with pytest.raises(TokenizerError, match="role"):
        tok.apply_chat_template([ChatMessage("wizard", "abracadabra")])
    with pytest.raises(TokenizerError, match="at least one"):
        tok.apply_chat_template([])


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_rebuild_text(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(t) for t in ids) == text.encode("utf-8")
    assert b"".join(tok.token_bytes(t) for t in ids).decode() == text


def test_token_bytes_whole_vocabulary(tok: TextTokenizer) -> None:
    for token_id in range(tok.vocab_size):
        data = tok.token_bytes(token_id)
        assert data, token_id
        if not tok.is_special(token_id):
            assert data.decode("utf-8", errors="replace") == tok.decode([token_id]), token_id
        assert tok.token_text(token_id) == data.decode("utf-8", errors="replace")


def test_token_bytes_partial_character(tok: TextTokenizer) -> None:
    ids = tok.encode("你")
    assert len(ids) == 2  # the character is split across two byte-level tokens
    assert b"".join(tok.token_bytes(t) for t in ids) == "你".encode()
    assert tok.token_text(ids[0]) == "\ufffd"


def test_special_and_unknown_ids(tok: TextTokenizer) -> None:
    assert tok.token_text(2) == "<|im_end|>"
    assert tok.token_bytes(2) == b"<|im_end|>"
    assert tok.token_bytes(tok.vocab_size + 10) == b""
    assert tok.token_text(-1) == ""
    hello = tok.encode("hello")
    assert tok.decode([2, *hello, 1, tok.vocab_size + 5]) == "hello"


def test_missing_path_and_wrong_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nope.gguf")
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\0" * 16)
    with pytest.raises(TokenizerError):
        load_tokenizer(junk)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(TokenizerError):
        load_tokenizer(fake)
    with pytest.raises(TokenizerError):
        load_tokenizer(tmp_path)  # a directory without a tokenizer


# ------------------------------------------------------------------ Hugging Face directory


@pytest.fixture(scope="module")
def hf_dir(hf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF's tokenizer saved as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("hf_model")
    hf.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return path


def edit_config(path: Path, **changes: Any) -> None:
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))


def set_template(path: Path, template: str | None) -> None:
    """Replace (or with None remove) the chat template wherever it is saved."""
    (path / "chat_template.jinja").unlink(missing_ok=True)
    edit_config(path, chat_template=None)
    if template is not None:
        (path / "chat_template.jinja").write_text(template)


def test_hf_directory_matches_gguf(tok: TextTokenizer, hf_dir: Path) -> None:
    local = load_tokenizer(hf_dir)
    assert local.name == hf_dir.name
    assert local.eos_token_ids == [2, 0]
    assert local.vocab_size == tok.vocab_size
    for text in TEXTS:
        assert local.encode(text) == tok.encode(text)
    for messages in conversations():
        assert local.apply_chat_template(messages) == tok.apply_chat_template(messages)
    ids = tok.encode("你好 🎉")
    assert [local.token_bytes(t) for t in ids] == [tok.token_bytes(t) for t in ids]


def test_hf_directory_add_bos(hf_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "bos"
    shutil.copytree(hf_dir, path)
    edit_config(path, add_bos_token=True)
    local = load_tokenizer(path)
    assert local.add_bos
    assert local.encode("hi") == [1, *local.encode("hi")[1:]]
    assert local.encode("<|im_start|>hi")[:2] != [1, 1]  # no doubled BOS


def test_hf_directory_without_chat_template(hf_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "plain"
    shutil.copytree(hf_dir, path)
    set_template(path, None)
    local = load_tokenizer(path)
    assert local.chat_template is None
    assert local.encode("hi") == [6004]
    with pytest.raises(TokenizerError, match="no chat template"):
        local.apply_chat_template([ChatMessage("user", "hi")])


def test_template_raising_becomes_tokenizer_error(hf_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "strict"
    shutil.copytree(hf_dir, path)
    set_template(
        path,
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('tools are not supported') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    local = load_tokenizer(path)
    assert local.apply_chat_template([ChatMessage("user", "hi")])[-4:] == [1, 520, 9531, 198]
    with pytest.raises(TokenizerError, match="tools are not supported"):
        local.apply_chat_template([ChatMessage("tool", "42")])


def test_tools_and_tool_calls_reach_the_template(hf_dir: Path, tmp_path: Path) -> None:
    from houchu.transport.messages import ToolCallMessage

    path = tmp_path / "tools"
    shutil.copytree(hf_dir, path)
    set_template(
        path,
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}|{% endif %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments.city }}]"
        "{% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}|{% endfor %}",
    )
    local = load_tokenizer(path)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    call = ToolCallMessage(id="c1", name="get_weather", arguments='{"city": "Oslo"}')
    messages = [
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "", [call]),
        ChatMessage("tool", "sunny", tool_call_id="c1"),
    ]
    assert local.render_chat(messages, tools) == (
        "TOOLS:get_weather;|user:weather?|assistant:[get_weather Oslo]|tool:sunny(c1)|"
    )
    assert local.render_chat(messages[:1]) == "user:weather?|"


def test_template_reads_tools(tok: TextTokenizer) -> None:
    """The default model's template never reads ``tools`` (the server prints a note at
    start-up); a template that renders them does."""
    assert tok.chat_template is not None and not tok.template_reads_tools
    assert reads_variable("{% if tools %}{{ tools | tojson }}{% endif %}", "tools")
    assert not reads_variable("{% set tools = [] %}{{ tools }}{{ messages }}", "tools")
    assert not reads_variable("{% if %}", "tools")  # does not parse


def test_chat_template_options_match_transformers(tok: TextTokenizer, hf: Any) -> None:
    """vLLM's ``add_generation_prompt`` and ``continue_final_message`` give
    transformers' ids: a continued final message is left open (no end of turn)."""
    messages = [ChatMessage("user", "Name a colour."), ChatMessage("assistant", "The colour is")]
    turns = [{"role": m.role, "content": m.content} for m in messages]
    for opts in (
        {"add_generation_prompt": False},
        {"add_generation_prompt": False, "continue_final_message": True},
    ):
        assert tok.apply_chat_template(messages, **opts) == hf.apply_chat_template(
            turns, tokenize=True, return_dict=False, **opts
        )
    open_text = tok.render_chat(messages, add_generation_prompt=False, continue_final_message=True)
    assert open_text.endswith("The colour is")
    assert tok.render_chat(messages, add_generation_prompt=False).startswith(open_text)


def test_chat_template_kwargs_are_template_variables(hf_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "kwargs"
    shutil.copytree(hf_dir, path)
    set_template(
        path,
        "{% if enable_thinking is defined and not enable_thinking %}NO-THINK|{% endif %}"
        "{% if style is defined %}{{ style.tone }}{% else %}plain{% endif %}|"
        "{% for m in messages %}{{ m.content }}|{% endfor %}",
    )
    local = load_tokenizer(path)
    messages = [ChatMessage("user", "Hi")]
    kwargs = {"enable_thinking": False, "style": {"tone": "dry"}}
    assert local.render_chat(messages, chat_template_kwargs=kwargs) == "NO-THINK|dry|Hi|"
    assert local.render_chat(messages) == "plain|Hi|"
    assert local.apply_chat_template(messages, chat_template_kwargs=kwargs) == local.encode_plain(
        "NO-THINK|dry|Hi|"
    )
