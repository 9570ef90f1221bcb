"""``houchu.devtools.tiny_models.train_tiny_model``: the same arguments give the same weights, the
folder it writes has ``make_tiny_model``'s layout (houchu's loader and the GGUF writers
take it alike), training lowers the loss, and bad arguments raise ``ValueError``. The
quality it buys is measured in test_family_quant_quality.py."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from houchu.bench.texts import QUALITY_EN
from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_model, train_tiny_model
from houchu.model.quant.quality import text_logprobs
from houchu.model.weights.loader import load_model

TEXT = QUALITY_EN.read_text()
IDS = [b for b in TEXT.encode("ascii", "ignore") if b < 128]
SHORT = {"steps": 3, "seq_len": 32}  # a few cheap steps: enough to change the weights


def test_same_arguments_give_the_same_weights(tmp_path):
    """Two runs with the same seed write identical tensors; another seed differs, and
    training moved the weights away from ``make_tiny_model``'s draw. The global torch
    settings it changes are restored."""
    threads, determ = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    a = train_tiny_model(tmp_path / "a", "qwen2", IDS, seed=3, **SHORT)
    b = train_tiny_model(tmp_path / "b", "qwen2", IDS, seed=3, **SHORT)
    c = train_tiny_model(tmp_path / "c", "qwen2", IDS, seed=4, **SHORT)
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (
        threads,
        determ,
    )
    wa, wb, wc = (load_file(str(t.path / "model.safetensors")) for t in (a, b, c))
    assert a.train_bpb == b.train_bpb
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    random = load_file(str(make_tiny_model(tmp_path / "r", "qwen2", seed=3) / "model.safetensors"))
    assert not torch.equal(wa["lm_head.weight"], random["lm_head.weight"])


def test_folder_layout_and_gguf_twin(tmp_path):
    """The trained folder holds the same files and tensors (names, shapes, float32) as
    ``make_tiny_model``'s, loads in houchu, and its GGUF twin gives the same
    log-probabilities."""
    trained = train_tiny_model(tmp_path / "t", "llama", IDS, seed=1, **SHORT).path
    random = make_tiny_model(tmp_path / "r", "llama", seed=1)
    assert sorted(p.name for p in trained.iterdir()) == sorted(p.name for p in random.iterdir())
    wt, wr = (load_file(str(p / "model.safetensors")) for p in (trained, random))
    assert {k: (v.shape, v.dtype) for k, v in wt.items()} == {
        k: (v.shape, v.dtype) for k, v in wr.items()
    }
    twin = write_llama_gguf(trained, tmp_path / "t.gguf")
    ids = IDS[:64]
    with torch.inference_mode():
        ref = text_logprobs(load_model(trained), ids, chunk=16, page_size=4)
        got = text_logprobs(load_model(twin), ids, chunk=16, page_size=4)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_training_lowers_the_loss(tmp_path):
    """40 steps take the loss on the training windows well below a uniform guess over
    the 128-token vocabulary (7 bits per byte)."""
    trained = train_tiny_model(tmp_path / "t", "llama", IDS, steps=40, seq_len=64, seed=2)
    assert trained.train_bpb < 5.0, trained


@pytest.mark.parametrize(
    ("ids", "kwargs", "match"),
    [
        (IDS[:32], {"seq_len": 32}, "more than seq_len"),
        ([5, 300, 7] * 20, {"seq_len": 8}, r"in \[0, 128\)"),
        (IDS, {"steps": 0}, ">= 1"),
    ],
)
def test_bad_arguments_raise(tmp_path, ids, kwargs, match):
    """Too few ids, an id outside the vocabulary and a zero step count raise ``ValueError``."""
    with pytest.raises(ValueError, match=match):
        train_tiny_model(tmp_path / "t", "llama", ids, **kwargs)
