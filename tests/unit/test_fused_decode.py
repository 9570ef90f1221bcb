"""The fused decode layers (``houchu.cpu.fused_layers``, ``decode_layers.cpp``) against the
per-op path it replaces: bit-equal logits and KV, where it applies and where it does not."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.batch import build_batch
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = {"a": [1, 5, 9, 33, 70, 2, 8], "b": [7, 7, 100], "c": [3], "d": [4, 4, 4, 4, 9]}
#: head_dim 16 takes the portable attention loop, 64 the group kernel (AVX-512 or AVX2)
SHAPES = {
    "d16": {},
    "d64": {"hidden_size": 256, "intermediate_size": 192, "num_attention_heads": 4},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {
        name: make_tiny_llama(tmp_path_factory.mktemp(name), seed=3, **cfg)
        for name, cfg in SHAPES.items()
    }


def _runner(path, **kw) -> ModelRunner:
    args = {"page_size": 4, "num_pages": 40, "attention_backend": "cpu"}
    return ModelRunner(path, exact(**(args | kw)), quiet=True)


def _prefill_then_decode_batch(r: ModelRunner, rows: int):
    """Prefill ``rows`` prompts, then the StepBatch of one decode token each."""
    rids = list(PROMPTS)[:rows]
    tables = {x: list(range(i * 8, i * 8 + 8)) for i, x in enumerate(rids)}
    init = [SeqInit(rid=x, sampling=GREEDY, prompt_ids=PROMPTS[x]) for x in rids]
    work = [
        SeqWork(rid=x, token_ids=PROMPTS[x], start_pos=0, page_table=tables[x], sample=True)
        for x in rids
    ]
    r.execute(StepPlan(step_id=0, init=init, work=work))
    decode = [
        SeqWork(
            rid=x,
            token_ids=[11 + i],
            start_pos=len(PROMPTS[x]),
            page_table=tables[x],
            sample=True,
        )
        for i, x in enumerate(rids)
    ]
    return build_batch(
        decode,
        page_size=r.pool.page_size,
        num_pages=r.pool.num_pages,
        max_context=r.max_context,
        vocab_size=r.config.vocab_size,
    )


def _both_paths(r: ModelRunner, rows: int):
    """Logits and KV pool after the decode step, per-op then fused (same pool state)."""
    batch = _prefill_then_decode_batch(r, rows)
    fused, out = r.model.fused, []
    with torch.inference_mode():
        for f in (None, fused):
            r.model.fused = f
            logits = r.model(batch, r.pool, r.backend)
            scales = (r.pool.k_scale, r.pool.v_scale) if r.pool.quantized else ()
            out.append((logits, r.pool.k.clone(), r.pool.v.clone(), [t.clone() for t in scales]))
    r.model.fused = fused
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("quant", ["int4", "int8", "w8a8"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_fused_equals_per_op(models, shape, dtype, quant, rows, kv):
    r = _runner(models[shape], dtype=dtype, quantization=quant, kv_cache_dtype=kv)
    before = r.model.fused.steps
    (l0, k0, v0, s0), (l1, k1, v1, s1) = _both_paths(r, rows)
    assert r.model.fused.steps == before + 1, "the fused kernel did not run"
    assert l0.shape == (rows, r.config.vocab_size)
    assert torch.equal(l0, l1)
    assert torch.equal(k0, k1) and torch.equal(v0, v1)
    if kv == "int8":
        assert all(map(torch.equal, s0, s1))


@pytest.mark.parametrize(
    "kw",
    [
        {"quantization": "none"},  # dense projections: no GEMV blob
        {"quantization": "int4", "kv_cache_dtype": "fp8"},  # an fp8 pool
        {"quantization": "int4", "attention_backend": "torch"},
        {"quantization": "int4", "disable_fused_layers": True},
    ],
)
def test_fused_stays_off_where_it_does_not_apply(models, kw):
    r = _runner(models["d16"], **kw)
    steps = r.model.fused.steps if r.model.fused else 0
    (l0, *_), (l1, *_) = _both_paths(r, 2)
    assert (r.model.fused.steps if r.model.fused else 0) == steps
    assert torch.equal(l0, l1)


def test_the_startup_line_names_the_fused_layers_only_where_they_apply(models):
    """A dense model has no GEMV blobs: no fused step can run, and the runner's summary
    (and runner_bench's path column, through ``FusedDecode.applies``) does not say so."""
    dense = _runner(models["d16"], quantization="none")
    int4 = _runner(models["d16"], quantization="int4")
    assert not dense.model.fused.applies(1) and int4.model.fused.applies(1)
    assert "with fused decode layers" not in dense.summary(0.0)
    assert "with fused decode layers" in int4.summary(0.0)


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_fused_greedy_tokens_through_the_runner(models, kv):
    """Decode steps through ``execute``: the same greedy tokens fused and per-op."""
    from tests.support.greedy import generate

    kw = {"quantization": "int4", "dtype": "bfloat16", "kv_cache_dtype": kv}
    on = _runner(models["d64"], **kw)
    off = _runner(models["d64"], disable_fused_layers=True, **kw)
    assert generate(on, 8) == generate(off, 8)
    assert on.model.fused.steps >= 7


def test_decode_layers_rejects_bad_input(models):
    r = _runner(models["d16"], quantization="int4")
    batch = _prefill_then_decode_batch(r, 1)
    meta = r.backend.prepare(batch)
    run = r.model.fused.bind(batch, r.pool, meta)
    assert run is not None
    x = torch.randn(1, r.config.hidden_size)
    cos = sin = torch.ones(1, 1, r.config.head_dim)
    run(1, x, cos, sin)  # well formed
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        run(1, x.half(), cos, sin)
    with pytest.raises(RuntimeError, match=r"\[B, 1, D\]"):
        run(1, x, cos[:, :, :4], sin)
    with pytest.raises(RuntimeError, match=r"\[B, hidden\]"):
        run(1, torch.randn(1, 2 * x.shape[1])[:, ::2], cos, sin)  # strided
    meta.decode_lens[0] = 10_000  # past the row's pages
    with pytest.raises(RuntimeError, match="outside"):
        run(1, x, cos, sin)
    meta.decode_lens[0] = 2
    meta.decode_pages[0, 0] = r.pool.num_pages  # a page the pool does not have
    with pytest.raises(RuntimeError, match="outside the pool"):
        run(1, x, cos, sin)
    meta.decode_pages[0, 0] = 0
    kernel, w = cpu_kernels.ops().decode_layers, r.model.fused._layer_weights(1, 2)
    args = [x, cos, sin, w.norms, 1e-5, w.linears, w.group_sizes, w.out_features]
    tail = [w.act_dtype, r.pool.k, r.pool.v, meta.decode_pages, meta.decode_lens, 0.25]
    with pytest.raises(RuntimeError, match="4 entries per layer"):
        kernel(*args[:5], w.linears[:-1], *args[6:], *tail)
    with pytest.raises(RuntimeError, match="2 tensors per layer"):
        kernel(*args[:3], w.norms[:-1], *args[4:], *tail)
    swap = [0, 3, 2, 1, *range(4, len(w.linears))]  # o_proj and down swapped
    with pytest.raises(RuntimeError, match="do not chain"):
        kernel(
            *args[:5],
            [w.linears[i] for i in swap],
            [w.group_sizes[i] for i in swap],
            [w.out_features[i] for i in swap],
            *tail,
        )


@pytest.mark.parametrize("rows", [1, 3])
def test_logits_are_never_rounded_to_bfloat16(models, rows):
    """With bfloat16 activations the int8 LM head still gives float32 logits, fused and
    per-op (the path a prefill's last tokens take): logits rounded to bfloat16 sit on a
    grid of 1/16 at 16, where near-ties of the top tokens become exact ties."""
    r = _runner(models["d64"], quantization="int4")
    if r.model.lm_head.act_dtype != torch.bfloat16:
        pytest.skip("the int4 layers compute in float32 on this CPU: nothing is rounded")
    (l0, *_), (l1, *_) = _both_paths(r, rows)
    for logits in (l0, l1):
        assert logits.dtype == torch.float32
        assert (logits != logits.bfloat16().float()).float().mean() > 0.9
