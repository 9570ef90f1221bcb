"""Each tensor-parallel rank reads only its shard: safetensors slices and a GGUF's tensor
views cut before dequantizing (or repacking to int4) give exactly what cutting the whole
weights gives (``shard_weights``), for every rank; a GGUF column cut inside a
quantization block is refused with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.quant.functions import Int4Weight
from houchu.model.weights.loader import load_tensors
from houchu.model.weights.shard import Shard, TensorParallelError
from houchu.runner.tensor_parallel.shards import shard_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # vocabulary 129: not a multiple of 2 or 3, so each rank's vocabulary rows are padded
    d = tmp_path_factory.mktemp("shard")
    heads = {"num_attention_heads": 6, "num_key_value_heads": 6, "hidden_size": 192}
    return make_tiny_llama(d, seed=4, vocab_size=129, intermediate_size=192, **heads)


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        if isinstance(w, Int4Weight):
            assert isinstance(g, Int4Weight) and g.group_size == w.group_size, name
            for a, b in ((g.q, w.q), (g.scale, w.scale), (g.offset, w.offset)):
                assert torch.equal(a, b), name
        else:
            assert g.shape == w.shape and g.dtype == w.dtype, name
            assert torch.equal(g, w), name


def test_shard_kinds():
    s = Shard(1, 2)
    assert s.kind("model.layers.3.self_attn.q_proj.weight") == "rows"
    assert s.kind("model.layers.3.self_attn.k_proj.bias") == "rows"
    assert s.kind("model.layers.3.self_attn.o_proj.weight") == "cols"
    assert s.kind("model.layers.3.mlp.up_proj.weight") == "rows"
    assert s.kind("model.layers.3.mlp.down_proj.weight") == "cols"
    assert s.kind("model.embed_tokens.weight") == s.kind("lm_head.weight") == "vocab"
    assert s.kind("model.layers.3.input_layernorm.weight") is None
    assert s.kind("model.norm.weight") is None
    assert s.span(10) == slice(5, 10)
    assert Shard(2, 3).vocab_span(129) == (slice(86, 129), 0)
    assert Shard(1, 2).vocab_span(129) == (slice(65, 129), 1)  # 64 rows and one of zeros


@pytest.mark.parametrize("world", [2, 3])
def test_safetensors_ranks_read_their_shard(tiny_dir, world):
    cfg, whole = load_tensors(tiny_dir, torch.float32)
    for rank in range(world):
        _, got = load_tensors(tiny_dir, torch.float32, shard=Shard(rank, world))
        want = shard_weights(cfg, dict(whole), rank, world)
        _same(got, want)
        assert got["model.embed_tokens.weight"].shape[0] == -(-129 // world)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_ranks_safetensors_shard_leaves_the_file_unmapped(tmp_path):
    """The rows a rank reads are copied out of safetensors' mapping of the file, so the
    mapping (and the pages of the file the rank touched) goes when the file is closed."""
    model = make_tiny_llama(tmp_path / "m", seed=4)
    file = str((model / "model.safetensors").resolve())
    _, got = load_tensors(model, torch.float32, shard=Shard(1, 2))
    assert got["model.layers.0.self_attn.q_proj.weight"].shape == (32, 64)  # alive
    assert file not in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize(
    ("qtype", "keep_q4"),
    [
        ("F32", False),
        ("F16", False),  # a float type: columns cut by element, not by block
        ("Q8_0", False),
        ("Q4_0", False),
        ("Q4_0", True),
        ("Q4_1", False),
        ("Q4_1", True),
    ],
)
def test_gguf_ranks_cut_their_shard_before_dequantizing(tiny_dir, tmp_path, qtype, keep_q4):
    """At tp 3 the o_proj (192 → 64 columns) and down (192 → 64) cuts fall on the
    32-element blocks of Q8_0 / Q4_1; q/k rows are un-permuted per rank's heads."""
    path = write_llama_gguf(tiny_dir, tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    cfg, whole = load_tensors(path, torch.float32, keep_q4)
    assert any(isinstance(w, Int4Weight) for w in whole.values()) == keep_q4
    for rank in range(3):
        _, got = load_tensors(path, torch.float32, keep_q4, shard=Shard(rank, 3))
        _same(got, shard_weights(cfg, dict(whole), rank, 3))


def test_a_gguf_cut_inside_a_block_is_refused(tmp_path):
    # MLP width 96 at tp 2: down_proj's 48 input columns per rank cut a 32-element block
    hf = make_tiny_llama(tmp_path / "m", seed=4, intermediate_size=96)
    path = write_llama_gguf(hf, tmp_path / "m.gguf", qtype="Q8_0")
    with pytest.raises(TensorParallelError, match="Q8_0 blocks of 32 do not divide"):
        load_tensors(path, torch.float32, shard=Shard(0, 2))


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_a_matrix_dequantized_in_chunks_equals_it_whole(tiny_dir, tmp_path, monkeypatch, qtype):
    """Chunks of 3 rows and a ragged last one, cast into bfloat16 (each rank's vocabulary
    rows padded): the same values as dequantizing the whole tensor, then casting."""
    from houchu.model.gguf.index import open_gguf_index
    from houchu.model.weights import gguf as weights_gguf

    path = write_llama_gguf(tiny_dir, tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    monkeypatch.setattr(weights_gguf, "CHUNK_ELEMENTS", 3 * 192 + 1)
    shard = Shard(1, 2)
    for t in open_gguf_index(path).tensors:
        name = weights_gguf.gguf_to_hf_name(t.name)
        whole = torch.from_numpy(weights_gguf.dequantize_tensor(t))
        if whole.dim() != 2:
            continue
        got = weights_gguf.dequantized_part(t, name, shard, torch.bfloat16)
        assert got.dtype == torch.bfloat16, name
        want = whole
        kind = shard.kind(name)
        if kind == "rows":
            want = whole[shard.span(whole.shape[0])]
        elif kind == "cols":
            want = whole[:, shard.span(whole.shape[1])]
        elif kind == "vocab":
            rows, pad = shard.vocab_span(whole.shape[0])
            want = torch.nn.functional.pad(whole[rows], (0, 0, 0, pad))
        assert torch.equal(got, want.to(torch.bfloat16)), name


_READ_ONE = """
import sys
from pathlib import Path
from houchu.model.gguf.file import open_gguf
from houchu.model.weights.gguf import dequantized_part

def kib(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1])

t = open_gguf(sys.argv[1]).tensors[0]
dequantized_part(t, "model.layers.0.mlp.down_proj.weight", None)  # once: torch's own start-up
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
before = kib("VmRSS:")
w = dequantized_part(t, "model.layers.0.mlp.down_proj.weight", None)
print(kib("VmHWM:") - before, w.numel() * w.element_size() // 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_reading_a_tensor_costs_its_result_and_a_chunk(tmp_path, qtype):
    """A 2048 x 4096 matrix (32 MiB in float32) read a second time in a fresh process
    (the first pays for torch's own start and maps the file) raises its peak resident set
    by the result and at most 8 MiB more (read whole, the dequantizer's float32
    temporaries took 50 MiB more)."""
    import gguf
    import numpy as np

    qt = gguf.GGMLQuantizationType[qtype]
    dense = np.random.default_rng(0).standard_normal((2048, 4096), dtype=np.float32)
    path = tmp_path / "one.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_down.weight", gguf.quants.quantize(dense, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = subprocess.run(
        [sys.executable, "-c", _READ_ONE, str(path)], capture_output=True, text=True, check=True
    )
    grew_kib, result_kib = map(int, out.stdout.split())
    assert result_kib == 32 * 1024
    assert grew_kib < result_kib + 8 * 1024, (grew_kib, result_kib)
