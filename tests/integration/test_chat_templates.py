"""The built-in chat templates (``houchu.text.chat_templates``): which one a model without
its own gets (GGUF ``general.architecture``, HF ``model_type``, the vocabulary's
markers), ``--chat-template NAME|FILE|inline`` and its errors, and that each template
writes what llama.cpp's built-in format writes (``llm_chat_apply_template``, ported
below), with the BOS llama.cpp's tokenizer adds written once by the template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from houchu.text.chat_templates import (
    KNOWN_TEMPLATES,
    ChatTemplateError,
    choose_template,
    family_template,
    flag_template,
)
from houchu.text.tokenizer.core import TokenizerError, load_tokenizer
from houchu.text.tokenizer.loading import gguf_architecture, hf_model_type
from houchu.transport.messages import ChatMessage

pytestmark = pytest.mark.slow

# ------------------------------------------------------------------ llama.cpp's formats


def _trim(text: str) -> str:
    return text.strip(" \t\n\r\f\v")


def llama_cpp_format(name: str, chat: list[tuple[str, str]], add_ass: bool) -> str:
    """llama.cpp's ``llm_chat_apply_template`` (src/llama-chat.cpp) for houchu's names,
    ported line by line; ``llama2`` is llama.cpp's ``llama2-sys-bos``. Without the BOS
    that llama.cpp's tokenizer prepends."""
    out = ""
    if name == "chatml":
        for role, content in chat:
            out += f"<|im_start|>{role}\n{content}<|im_end|>\n"
        if add_ass:
            out += "<|im_start|>assistant\n"
    elif name in ("mistral-v1", "mistral-v3"):
        lead = " " if name == "mistral-v1" else ""
        trail = " "
        inside = False
        for role, content in chat:
            if not inside:
                out += f"{lead}[INST]{trail}"
                inside = True
            if role == "system":
                out += content + "\n\n"
            elif role == "user":
                out += content + lead + "[/INST]"
            else:
                out += trail + (_trim(content) if name == "mistral-v3" else content) + "</s>"
                inside = False
    elif name == "llama2":
        inside = True
        out += "[INST] "
        for role, content in chat:
            if not inside:
                inside = True
                out += "<s>[INST] "
            if role == "system":
                out += f"<<SYS>>\n{content}\n<</SYS>>\n\n"
            elif role == "user":
                out += content + " [/INST]"
            else:
                out += content + "</s>"
                inside = False
    elif name == "gemma":
        system = ""
        for role, content in chat:
            if role == "system":
                system += _trim(content)
                continue
            role = "model" if role == "assistant" else role
            out += f"<start_of_turn>{role}\n"
            if system and role != "model":
                out += system + "\n\n"
                system = ""
            out += _trim(content) + "<end_of_turn>\n"
        if add_ass:
            out += "<start_of_turn>model\n"
    elif name == "llama3":
        for role, content in chat:
            out += f"<|start_header_id|>{role}<|end_header_id|>\n\n{_trim(content)}<|eot_id|>"
        if add_ass:
            out += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    elif name == "deepseek2":
        for role, content in chat:
            if role == "system":
                out += content + "\n\n"
            elif role == "user":
                out += "User: " + content + "\n\n"
            elif role == "assistant":
                out += "Assistant: " + content + "<｜end▁of▁sentence｜>"
        if add_ass:
            out += "Assistant:"
    elif name == "deepseek3":
        for role, content in chat:
            if role == "system":
                out += content + "\n\n"
            elif role == "user":
                out += "<｜User｜>" + content
            elif role == "assistant":
                out += "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>"
        if add_ass:
            out += "<｜Assistant｜>"
    else:
        raise AssertionError(name)
    return out


#: The BOS each family's tokenizer adds in llama.cpp (a ChatML model's does not).
BOS = {"chatml": "", "llama2": "<s>", "mistral-v1": "<s>", "mistral-v3": "<s>"}
DEFAULT_BOS = "<BOS>"

CHATS = [
    [("user", "What is 2+2?")],
    [("system", "You are terse."), ("user", "Hi 你好 🎉")],
    [("system", "  Be brief. \n"), ("user", "  Name a colour. "), ("assistant", " Blue. ")],
    [
        ("user", "Name a colour."),
        ("assistant", "Blue."),
        ("user", "Another one?"),
        ("assistant", "Red."),
        ("user", "And one more?"),
    ],
    [("system", "A"), ("system", "B"), ("user", "x\n\ny")],
]


def render(name: str, chat: list[tuple[str, str]], add_ass: bool, bos: str) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    conversation = [{"role": r, "content": c} for r, c in chat]
    out, _ = render_jinja_template(
        [conversation],
        chat_template=KNOWN_TEMPLATES[name],
        add_generation_prompt=add_ass,
        bos_token=bos,
        eos_token="</s>",
    )
    return out[0]


@pytest.mark.parametrize("add_ass", [True, False])
@pytest.mark.parametrize("chat", CHATS, ids=range(len(CHATS)))
@pytest.mark.parametrize("name", sorted(KNOWN_TEMPLATES))
def test_each_template_writes_llama_cpps_format(name, chat, add_ass):
    bos = BOS.get(name, DEFAULT_BOS)
    want = ("" if name == "chatml" else bos) + llama_cpp_format(name, chat, add_ass)
    assert render(name, chat, add_ass, bos) == want


def test_gemma_prompt_exactly():
    """Gemma: one BOS, the system message folded into the first user turn, ``model`` as
    the assistant's role, the generation prompt."""
    chat = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")]
    assert render("gemma", chat, True, "<bos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert render("gemma", [("user", "Hi")], True, "<bos>") == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


# ------------------------------------------------------------------ detection


@pytest.mark.parametrize(
    "architecture, vocabulary, want",
    [
        # GGUF general.architecture
        ("gemma", (), "gemma"),
        ("gemma2", (), "gemma"),
        ("gemma3", (), "gemma"),
        ("qwen2", (), "chatml"),
        ("qwen3", (), "chatml"),
        ("qwen3moe", (), "chatml"),
        ("llama", (), "llama2"),
        ("llama", ("<|start_header_id|>", "<|eot_id|>"), "llama3"),
        ("llama", ("<|im_start|>",), "chatml"),  # SmolLM
        ("llama", ("[INST]",), "mistral-v3"),
        ("deepseek2", (), "deepseek2"),
        ("deepseek2", ("<｜User｜>",), "deepseek3"),
        # HF model_type
        ("gemma3_text", (), "gemma"),
        ("qwen3_moe", (), "chatml"),
        ("mistral", (), "mistral-v1"),
        ("mistral", ("[INST]",), "mistral-v3"),
        ("deepseek_v2", (), "deepseek2"),
        ("deepseek_v3", (), "deepseek3"),
        # none
        ("gpt2", (), None),
        (None, ("<|im_start|>",), None),
    ],
)
def test_family_template(architecture, vocabulary, want):
    assert family_template(architecture, set(vocabulary)) == want


def test_choose_template_order():
    own = "{{ messages[0]['content'] }}"
    assert choose_template(own, "gemma3").template == own
    assert choose_template(own, "gemma3").source == "the model's own"
    fam = choose_template(None, "gemma3")
    assert fam.template == KNOWN_TEMPLATES["gemma"]
    assert fam.source == "gemma, built in for architecture gemma3 (the model has none)"
    flag = choose_template(own, "gemma3", flag="llama3")
    assert (flag.template, flag.source) == (KNOWN_TEMPLATES["llama3"], "llama3 (--chat-template)")
    none = choose_template(None, "gpt2")
    assert none.template is None and "--chat-template" in none.source


# ------------------------------------------------------------------ --chat-template values


def test_flag_by_name_file_and_inline(tmp_path, monkeypatch):
    assert flag_template("gemma") == (KNOWN_TEMPLATES["gemma"], "gemma")
    jinja = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    file = tmp_path / "t.jinja"
    file.write_text(jinja)
    monkeypatch.chdir(tmp_path)
    assert flag_template("t.jinja") == (jinja, str(file.resolve()))
    assert flag_template(str(file)) == (jinja, str(file.resolve()))
    assert flag_template(jinja) == (jinja, "inline")


@pytest.mark.parametrize(
    "value, says",
    [
        ("gemma4", "not a known template name (chatml, deepseek2"),
        ("./missing.jinja", "not a file"),
        ("{% for m in messages %}", "not a valid Jinja template"),
        ("{{ messages[0] }", "not a valid Jinja template"),
    ],
)
def test_bad_flag_is_one_line(value, says):
    with pytest.raises(ChatTemplateError) as e:
        flag_template(value)
    assert says in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_file_is_one_line(tmp_path):
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n")
    with pytest.raises(ChatTemplateError, match="the file is empty"):
        flag_template(str(empty))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if x %}\nno end\n")
    with pytest.raises(ChatTemplateError, match="not a valid Jinja template") as e:
        flag_template(str(bad))
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ GGUF files


def write_gguf(path: Path, arch: str, specials: tuple[str, ...] = ()) -> Path:
    """A GGUF file with a tiny SentencePiece vocabulary (``<unk>``, ``<bos>``, ``<eos>``,
    ``specials``, ``▁`` and printable ASCII), BOS added, ``general.architecture`` ``arch``
    and no chat template."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    pieces = ["▁", *(chr(c) for c in range(33, 127))]
    tokens = ["<unk>", "<bos>", "<eos>", *specials, *pieces]
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3, *[3] * len(specials), *[1] * len(pieces)])
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOUCHU_CACHE", str(tmp_path / "cache"))


def test_gguf_gemma_without_template_gets_gemmas(tmp_path, cache):
    path = write_gguf(tmp_path / "gemma.gguf", "gemma3", ("<start_of_turn>", "<end_of_turn>"))
    assert gguf_architecture(path) == "gemma3"
    tok = load_tokenizer(path)
    assert tok.chat_template == KNOWN_TEMPLATES["gemma"]
    assert tok.chat_template_source == (
        "gemma, built in for architecture gemma3 (the model has none)"
    )
    assert 4 in tok.eos_token_ids  # <end_of_turn> ends the model's turn
    chat = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    text = tok.render_chat(chat)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tok.apply_chat_template(chat)
    assert ids[:2] == [1, 3]  # one BOS, then <start_of_turn>
    assert ids.count(1) == 1
    assert ids == tok.encode(text)  # encode adds no second BOS either


def test_gguf_llama_with_chatml_tokens_gets_chatml(tmp_path, cache):
    path = write_gguf(tmp_path / "smol.gguf", "llama", ("<|im_start|>", "<|im_end|>"))
    tok = load_tokenizer(path)
    assert tok.chat_template_source.startswith("chatml, built in for architecture llama")
    assert tok.render_chat([ChatMessage("user", "hi")]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert 4 in tok.eos_token_ids  # <|im_end|>


def test_gguf_flag_overrides_the_family(tmp_path, cache):
    path = write_gguf(tmp_path / "gemma.gguf", "gemma3", ("<start_of_turn>", "<end_of_turn>"))
    tok = load_tokenizer(path, chat_template="llama2")
    assert tok.chat_template_source == "llama2 (--chat-template)"
    assert tok.render_chat([ChatMessage("user", "hi")]) == "<bos>[INST] hi [/INST]"
    with pytest.raises(TokenizerError, match="not a known template name"):
        load_tokenizer(path, chat_template="nope")


def test_gguf_architecture_of_other_files(tmp_path, real_model_path):
    assert gguf_architecture(real_model_path) == "llama"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    assert gguf_architecture(junk) is None
    junk.write_bytes(b"NOPE")
    assert gguf_architecture(junk) is None


def test_the_models_own_template_is_kept(real_model_path):
    tok = load_tokenizer(real_model_path)
    assert tok.chat_template_source == "the model's own"
    assert "<|im_start|>" in (tok.chat_template or "")
    flagged = load_tokenizer(real_model_path, chat_template="gemma")
    assert flagged.chat_template == KNOWN_TEMPLATES["gemma"]
    assert flagged.chat_template_source == "gemma (--chat-template)"


# ------------------------------------------------------------------ Hugging Face folders


def hf_folder(path: Path, config: dict | None) -> Path:
    """A tiny tokenizer (``houchu.devtools.tiny_models.write_tiny_tokenizer``: no chat template)
    with ``config`` as ``config.json``."""
    from houchu.devtools.tiny_models import write_tiny_tokenizer

    write_tiny_tokenizer(path, 128)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "config, want",
    [
        ({"model_type": "gemma3_text"}, "gemma"),
        ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}, "gemma"),
        ({"text_config": {"model_type": "qwen3"}}, "chatml"),
        ({"model_type": "deepseek_v3"}, "deepseek3"),
        ({"model_type": "llama"}, "llama2"),
    ],
)
def test_hf_folder_by_model_type(tmp_path, config, want):
    path = hf_folder(tmp_path / "m", config)
    tok = load_tokenizer(path)
    assert tok.chat_template == KNOWN_TEMPLATES[want]
    arch = hf_model_type(path)
    assert (
        tok.chat_template_source == f"{want}, built in for architecture {arch} (the model has none)"
    )


def test_hf_folder_of_an_unknown_family_refuses_chat(tmp_path):
    tok = load_tokenizer(hf_folder(tmp_path / "m", {"model_type": "gpt2"}))
    assert tok.chat_template is None
    assert "architecture gpt2 has no built-in one" in tok.chat_template_source
    with pytest.raises(TokenizerError, match="--chat-template"):
        tok.apply_chat_template([ChatMessage("user", "hi")])
    assert load_tokenizer(hf_folder(tmp_path / "n", None)).chat_template is None


def test_hf_folder_inline_flag(tmp_path):
    path = hf_folder(tmp_path / "m", {"model_type": "gpt2"})
    inline = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    tok = load_tokenizer(path, chat_template=inline)
    assert tok.chat_template_source == "inline (--chat-template)"
    assert tok.render_chat([ChatMessage("user", "hi")]) == "[user]hi"


# ------------------------------------------------------------------ houchu serve's flag


def parse(argv: list[str]):
    from houchu.cli.main import build_parsers
    from houchu.options.checks import check_serve_args
    from houchu.options.parser import config_from_args

    parser, serve = build_parsers()
    args = parser.parse_args(["serve", *argv])
    check_serve_args(serve, args)
    return config_from_args(args)


def test_serve_flag_values(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.touch()
    base = ["--model", str(model)]
    assert parse(base).chat_template is None
    assert parse([*base, "--chat-template", "gemma"]).chat_template == "gemma"
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    monkeypatch.chdir(tmp_path)
    got = parse([*base, "--chat-template", "t.jinja"]).chat_template
    assert got == str((tmp_path / "t.jinja").resolve())  # absolute: the actors read it
    inline = "{{ messages[0]['content'] }}"
    assert parse([*base, "--chat-template", inline]).chat_template == inline


@pytest.mark.parametrize("value", ["gemma4", "nope.jinja", "{% if %}"])
def test_serve_flag_bad_value_is_one_line(tmp_path, capsys, value):
    from houchu.cli.main import main

    model = tmp_path / "m.gguf"
    model.touch()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", str(model), "--chat-template", value])
    assert e.value.code == 2
    first, hint = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("houchu serve: error: --chat-template")
    assert "--help" in hint
