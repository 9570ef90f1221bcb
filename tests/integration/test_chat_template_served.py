"""Chat on a model without a chat template: a tiny random Gemma 3 (``from_config``) beside a
tokenizer that has Gemma's turn tokens and no template is served with Gemma's built-in
template (the start-up line says so), answers ``/v1/chat/completions``, and renders the
prompt llama.cpp's gemma format gives; ``--chat-template FILE`` replaces it."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from houchu.devtools.tiny_models import make_tiny_model, write_tiny_tokenizer
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow

TURNS = ("<start_of_turn>", "<end_of_turn>")
FLAGS = ("--threads", "1", "--page-size", "4", "--num-pages", "128")
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    """A tiny Gemma 3 folder: ``config.json`` says ``gemma3_text``; the tokenizer (125
    byte-level tokens, then ``<start_of_turn>`` 125 and ``<end_of_turn>`` 126) has no
    chat template."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    path = make_tiny_model(tmp_path_factory.mktemp("gemma") / "hf", "gemma3_text", seed=3)
    write_tiny_tokenizer(path, 125)
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.add_tokens([AddedToken(t, special=True) for t in TURNS], special_tokens=True)
    tok.save_pretrained(str(path))
    assert tok.chat_template is None
    return path


def ids_of(path: Path, text: str) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    return list(tok(text, add_special_tokens=False)["input_ids"])


def chat(url: str) -> dict:
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(url: str) -> list[int]:
    r = requests.post(f"{url}/tokenize", json={"messages": MESSAGES}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_family_template_served(gemma):
    srv = start_server(gemma, *FLAGS)
    try:
        assert (
            "chat template: gemma, built in for architecture gemma3_text (the model has none)"
            in srv.output()
        )
        want = ids_of(gemma, "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n")
        want += ids_of(gemma, "<start_of_turn>model\n")
        assert want[:2] == [1, 125]  # one BOS, then the turn
        assert tokenize(srv.url) == want  # the gateway renders as the tokenizer actor
        body = chat(srv.url)
        assert body["usage"]["prompt_tokens"] == len(want)
        assert isinstance(body["choices"][0]["message"]["content"], str)
        assert body["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        stop_server(srv)


def test_chat_template_file_flag_served(gemma, tmp_path):
    template = tmp_path / "turns.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    srv = start_server(gemma, *FLAGS, "--chat-template", str(template))
    try:
        assert f"chat template: {template.resolve()} (--chat-template)" in srv.output()
        want = ids_of(gemma, "[system] Be brief.\n[user] Hi\n[assistant] ")
        assert tokenize(srv.url) == want
        assert chat(srv.url)["usage"]["prompt_tokens"] == len(want)
    finally:
        stop_server(srv)
