"""CUDA-only checks (skipped without a CUDA device): CUDA-graph replay against eager,
flash-attn against the torch backend, the int4 tinygemm / int8 kernels, and FP8 W8A8
(``torch._scaled_mm``) against the dense matmul and, on a tiny trained model, the exact
path.

Different kernels in bfloat16 (flash-attn against torch SDPA) round differently, so where
a near-tie flips one greedy token the free-running continuations part for good: those
are compared by teacher forcing (``forced_top1``), each runner's greedy token at every
position of the reference's sequences, position by position (on the CPU, bfloat16
against float32 keeps 0.97-1.0 of 36 positions over three random draws of the tiny
model, where the free-running tokens differ in two of them)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.linear.w8a8 import W8A8_MIN_ROWS, W8A8Linear
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SeqInit, SeqWork, StepPlan
from tests.support.greedy import GREEDY, generate
from tests.support.runner_options import exact

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
#: ``generate``'s prompts and page tables (6 pages each)
PROMPTS = {"a": [1, 5, 9, 33, 70, 2, 8], "b": [7, 7, 100], "c": [3]}
#: lowest teacher-forced top-1 agreement between two bfloat16 kernels: 3 of 36 may flip
FORCED_TOP1 = 0.9


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # head_dim 64 and 8 KV heads' worth of rows keep the CUDA int4 kernel's shape rules
    return make_tiny_llama(
        tmp_path_factory.mktemp("cuda"),
        seed=7,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    )


def runner(path, **kw) -> ModelRunner:
    base = {"page_size": 16, "num_pages": 64, "device": "cuda", "dtype": "bfloat16"}
    return ModelRunner(path, exact(**{**base, **kw}), quiet=True)


def forced_greedy(runner: ModelRunner, forced: dict[str, list[int]]) -> dict[str, list[int]]:
    """``PROMPTS`` prefilled together, then decoded together, each decode step fed
    ``forced``'s previous token rather than the runner's own (teacher forcing): the
    runner's greedy token at each of ``forced``'s positions (rid -> as many tokens)."""
    n = len(forced["a"])
    tables = {r: list(range(i * 6, i * 6 + 6)) for i, r in enumerate(PROMPTS)}
    init = [SeqInit(rid=r, sampling=GREEDY, prompt_ids=p) for r, p in PROMPTS.items()]
    work = [
        SeqWork(rid=r, token_ids=p, start_pos=0, page_table=tables[r], sample=True)
        for r, p in PROMPTS.items()
    ]
    out: dict[str, list[int]] = {r: [] for r in PROMPTS}
    for s in range(n):
        res = runner.execute(StepPlan(step_id=s, init=init if s == 0 else [], work=work))
        assert res.error is None, res.error
        for o in res.outputs:
            out[o.rid].append(o.token_id)
        work = [
            SeqWork(
                rid=r,
                token_ids=[forced[r][s]],
                start_pos=len(p) + s,
                page_table=tables[r],
                sample=True,
            )
            for r, p in PROMPTS.items()
        ]
    return out


def forced_top1(got: ModelRunner, ref: ModelRunner) -> float:
    """Share of positions where ``got``'s greedy token, teacher-forced on ``ref``'s
    greedy sequences (``generate``: 3 x 12 tokens), equals ``ref``'s."""
    want = generate(ref)
    have = forced_greedy(got, want)
    same = sum(a == b for r in want for a, b in zip(want[r], have[r], strict=True))
    return same / sum(map(len, want.values()))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_graph_replay_matches_eager(tiny_dir, backend):
    graphs = runner(tiny_dir, attention_backend=backend, decode_batch_sizes=(1, 4))
    assert graphs.accel.kind == "cuda_graph"
    eager = runner(tiny_dir, attention_backend=backend, disable_cuda_graph=True)
    assert generate(graphs) == generate(eager)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")
def test_flash_attn_matches_torch_backend(tiny_dir):
    """flash-attn against torch SDPA, both bfloat16 (teacher-forced top-1), eager and
    under CUDA graphs."""
    fa = runner(tiny_dir, attention_backend="flash-attn", page_size=256, disable_cuda_graph=True)
    ref = runner(tiny_dir, attention_backend="torch", page_size=256, disable_cuda_graph=True)
    assert forced_top1(fa, ref) >= FORCED_TOP1
    fa_g = runner(tiny_dir, attention_backend="flash-attn", page_size=256, decode_batch_sizes=(4,))
    assert forced_top1(fa_g, ref) >= FORCED_TOP1


@pytest.mark.parametrize("quant", ["int4", "int8", "w8a8"])
def test_quantized_kernels_run_on_cuda(tiny_dir, quant):
    r = runner(tiny_dir, quantization=quant, disable_cuda_graph=True)
    ref = runner(tiny_dir, disable_cuda_graph=True)
    got, want = generate(r), generate(ref)
    agree = sum(a == b for k in want for a, b in zip(want[k], got[k], strict=True))
    assert agree >= 0.5 * sum(map(len, want.values()))


def test_auto_dtype_is_bf16_and_the_line_names_the_gpu_and_graphs(tiny_dir):
    r = ModelRunner(tiny_dir, exact(device="cuda", num_pages=64, decode_batch_sizes=(1, 2)))
    if torch.cuda.is_bf16_supported(including_emulation=False):
        assert r.dtype == torch.bfloat16 and "--dtype auto: bfloat16 on CUDA" in r.choices
    facts = r.device_facts
    assert facts is not None and facts.name == torch.cuda.get_device_name(0)
    assert 0 < facts.free_bytes <= facts.total_bytes == torch.cuda.mem_get_info(0)[1]
    line = r.summary()
    assert f"on cuda ({facts.name}, " in line and "GiB free after the weights" in line
    assert f"attention {r.backend.name}, CUDA graphs for batch 1,2," in line


def test_mem_fraction_static_sizes_the_pool_from_free_memory(tiny_dir):
    r = runner(tiny_dir, num_pages=None, mem_fraction_static=0.3, disable_cuda_graph=True)
    assert r.pool_size.source.startswith("--mem-fraction-static 0.3 (")
    f = r.device_facts
    budget = 0.3 * f.total_bytes - (f.total_bytes - f.free_bytes)
    page = r.pool.page_size * r.pool.bytes_per_token
    assert 0 < r.pool.num_pages * page <= budget  # the reserve came off too
    assert r.pool.num_pages * page > budget - 4 * 2**30  # and not much else
    assert generate(r)  # it serves


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")
def test_auto_picks_flash_attn_with_256_token_pages(tiny_dir):
    r = runner(tiny_dir, page_size=None, attention_backend="auto", decode_batch_sizes=(1, 4))
    assert r.backend.name == "flash-attn" and r.pool.page_size == 256
    assert any("--page-size 256" in c for c in r.choices) and "--page-size 256" in r.summary()
    ref = runner(tiny_dir, page_size=256, attention_backend="torch", disable_cuda_graph=True)
    assert forced_top1(r, ref) >= FORCED_TOP1  # flash-attn against torch SDPA, bfloat16
    fallback = runner(tiny_dir, page_size=16, attention_backend="auto")
    assert fallback.backend.name in ("triton", "torch-sdpa")
    assert any("not a multiple of 256" in c for c in fallback.choices)


def test_host_tier_copies_are_pinned_and_ordered_on_their_own_stream():
    """The host KV tier's copies run on their own stream, ordered against the compute
    stream; the block is pinned in place, or where ``cudaHostRegister`` is refused the
    mirror says why (``unpinned_reason``, on its ``describe`` line) and copies from
    pageable memory (serving goes on), the same bytes either way."""
    import os
    import warnings

    from houchu.cache_tiers.host_pool import HostPool
    from houchu.model.kv.pool import KVPool
    from houchu.model.kv.transfer import HostKVMirror
    from houchu.transport.messages import PageCopy

    geometry = {"num_layers": 4, "page_size": 16, "num_kv_heads": 2, "head_dim": 64}
    pool = KVPool(num_pages=8, dtype=torch.bfloat16, device="cuda", **geometry)
    page_bytes = 2 * 4 * 16 * 2 * 64 * 2
    host = HostPool(f"houchu-cuda-test-{os.getpid()}", 4, page_bytes, create=True)
    mirror = HostKVMirror(pool, host)
    try:
        # pinned, or the documented fallback (cudaHostRegister refused: e.g. past the
        # locked-memory limit, or under gVisor): copies from pageable memory, said so
        if not mirror.pinned:
            assert mirror.unpinned_reason.startswith("cudaHostRegister failed: ")
            assert f"not pinned ({mirror.unpinned_reason})" in mirror.describe()
            warnings.warn(f"host KV tier not pinned here: {mirror.unpinned_reason}", stacklevel=1)
        assert mirror.stream != torch.cuda.current_stream()
        for _ in range(3):  # ordering: the copies wait for these writes, the reads for them
            pool.k.normal_()
            pool.v.normal_()
            k1, v1 = pool.k[:, 1].clone(), pool.v[:, 1].clone()
            mirror.save([PageCopy(1, 2)])
            pool.k[:, 1].zero_()  # after the store, on the compute stream
            mirror.load([PageCopy(5, 2)])
            assert torch.equal(pool.k[:, 5], k1) and torch.equal(pool.v[:, 5], v1)
            mirror.finish()
            slot = mirror._views(2)[0]  # the host bytes, complete once finish returns
            assert torch.equal(slot, k1.cpu())
        assert ("pinned in place" in mirror.describe()) == mirror.pinned
    finally:
        mirror.close()
        del mirror
        host.close()


def fp8_layer(w: torch.Tensor) -> W8A8Linear:
    """``w``'s W8A8 layer on the GPU, in the format the code picks there; skips the test
    where that is not FP8 (no FP8 tensor cores: int8 ``torch._int_mm`` runs instead)."""
    layer = W8A8Linear(w, "cuda")
    if layer.fmt != "fp8":
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        pytest.skip(f"W8A8 runs {layer.fmt} on this GPU (compute capability {cap}), not FP8")
    return layer


def count_scaled_mm(monkeypatch) -> list[int]:
    """Wrap ``torch._scaled_mm`` (the real one still runs): the returned list gets the
    rows of each call's first operand."""
    real = torch._scaled_mm
    rows: list[int] = []

    def counting(a: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows.append(a.shape[0])
        return real(a, *args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", counting)
    return rows


#: relative Frobenius error of FP8 W8A8 against the dense matmul: float8_e4m3fn keeps 3
#: mantissa bits (a rounding error of about 2.5% rms per operand, 3.7% for the product
#: of two, measured on the CPU's ``torch._scaled_mm`` for these shapes)
FP8_REL_ERR = 0.06


@pytest.mark.parametrize("rows", [W8A8_MIN_ROWS, 128, 200])  # 200: not a multiple of 16
def test_w8a8_fp8_gemm_matches_the_dense_matmul(monkeypatch, rows):
    """From ``W8A8_MIN_ROWS`` rows the layer multiplies on FP8 tensor cores (one
    ``torch._scaled_mm``, rows padded to 16) within ``FP8_REL_ERR`` of the float32
    matmul of the same weights; below, it runs weight-only int8 (no FP8 GEMM)."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(384, 512, generator=g) * 0.05  # [N, K]
    layer = fp8_layer(w)
    calls = count_scaled_mm(monkeypatch)
    x = torch.randn(rows, 512, generator=g).to("cuda", torch.bfloat16)  # [M, K]
    with torch.inference_mode():
        y = layer(x)
        ref = x.float() @ w.to("cuda").t()  # [M, N]
        assert calls == [rows + (-rows) % 16]
        assert y.shape == (rows, 384) and y.dtype == torch.bfloat16
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err < FP8_REL_ERR, err
        small = layer(x[: W8A8_MIN_ROWS - 1])
    assert len(calls) == 1  # no FP8 GEMM below W8A8_MIN_ROWS
    err_small = (
        (small.float() - ref[: W8A8_MIN_ROWS - 1]).norm() / ref[: W8A8_MIN_ROWS - 1].norm()
    ).item()
    assert err_small < 0.02, err_small  # weight-only int8: the weights' rounding only


#: the W8A8 model's lowest top-1 agreement with the exact path and highest mean
#: |Δ log p| (nats): FP8 W8A8 in bfloat16 measured 0.990 / 0.030 with the CPU's
#: ``torch._scaled_mm`` (bfloat16 alone 0.995 / 0.007)
W8A8_TOP1, W8A8_DLOGP = 0.9, 0.06


def test_w8a8_prefill_agrees_with_the_exact_path(tmp_path, monkeypatch):
    """A tiny Llama trained on the quality texts (peaked next-token distributions), the
    first 600 evaluated bytes in prefill chunks of 128 tokens: W8A8 on FP8 tensor cores
    (bfloat16) keeps ``W8A8_TOP1`` top-1 agreement with the exact path (float32, no
    quantization, on the GPU) and its mean |Δ log p| under ``W8A8_DLOGP``; every W8A8
    layer ran ``torch._scaled_mm`` on every chunk."""
    from houchu.devtools.tiny_models import train_tiny_model
    from houchu.model.quant.functions import QuantSpec
    from houchu.model.quant.quality import agreement, text_logprobs
    from houchu.model.weights.loader import load_model
    from tests.support.quality_texts import EN, EVAL, TRAIN

    fp8_layer(torch.randn(16, 16))  # skips without FP8
    path = train_tiny_model(tmp_path / "hf", "llama", TRAIN, seed=7).path
    ids = EN[:EVAL]
    chunks = -(-len(ids) // 128)  # 5: 4 x 128 and 88, each >= W8A8_MIN_ROWS
    with torch.inference_mode():
        ref = text_logprobs(load_model(path, device="cuda"), ids, chunk=128)
        model = load_model(path, torch.bfloat16, "cuda", quant=QuantSpec("w8a8"))
        layers = [m for m in model.modules() if isinstance(m, W8A8Linear)]
        assert layers and {m.fmt for m in layers} == {"fp8"}
        calls = count_scaled_mm(monkeypatch)
        got = text_logprobs(model, ids, chunk=128)
    assert len(calls) >= chunks * len(layers), (len(calls), chunks, len(layers))
    a = agreement(ref, got, ids)
    print(f"\n[cuda] W8A8 fp8 on a trained tiny Llama: {a}")
    assert a.top1 >= W8A8_TOP1 and a.mean_abs_dlogp <= W8A8_DLOGP, a
