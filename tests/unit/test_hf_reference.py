"""The golden tests' transformers reference kept between sessions (``tests.support.hf_reference``):
the kept tokenizer and model equal what transformers loaded, a damaged entry is built
again, an edited file gets an entry of its own. On a tiny Q8_0 GGUF written here, whose
model transformers' GGUF loader reads; it has no vocabulary, so its tokenizer is
transformers' tokenizer of the tiny model's folder."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import tests.support.hf_reference as ref
from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_llama, write_tiny_tokenizer


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("HOUCHU_CACHE", str(tmp_path / "cache"))
    hf_dir = make_tiny_llama(tmp_path / "hf", seed=3, tie_word_embeddings=True)
    write_tiny_tokenizer(hf_dir)
    gguf = write_llama_gguf(hf_dir, tmp_path / "tiny.gguf", qtype="Q8_0")
    loads = []

    def load_from_gguf(path):
        loads.append(path)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        return AutoTokenizer.from_pretrained(hf_dir), model.eval()

    monkeypatch.setattr(ref, "load_from_gguf", load_from_gguf)
    return gguf, loads


def _same(a: tuple, b: tuple) -> None:
    (tok_a, model_a), (tok_b, model_b) = a, b
    text = "hello world, 1 2 3"
    assert tok_a(text)["input_ids"] == tok_b(text)["input_ids"]
    sa, sb = model_a.state_dict(), model_b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = torch.tensor([[1, 5, 9, 33, 70]])
    with torch.inference_mode():
        assert torch.equal(model_a(ids).logits, model_b(ids).logits)


def test_the_kept_reference_is_what_transformers_loaded(tiny_gguf, tmp_path):
    gguf, loads = tiny_gguf
    first = ref.hf_reference(gguf)  # loaded from the GGUF, then kept
    entry = tmp_path / "cache" / "test-references" / ref._key(gguf)
    assert (entry / "model.safetensors").exists() and len(loads) == 1
    kept = ref.hf_reference(gguf)  # from the kept files
    assert len(loads) == 1
    _same(kept, first)
    assert type(kept[1]) is type(first[1])
    # a damaged entry is loaded from the GGUF again, and kept again
    (entry / "model.safetensors").write_bytes(b"not safetensors")
    _same(ref.hf_reference(gguf), first)
    assert len(loads) == 2 and (entry / "model.safetensors").stat().st_size > 100
    # an edited file has a key of its own
    os.utime(gguf, ns=(1, 1))
    assert ref._key(gguf) != entry.name
