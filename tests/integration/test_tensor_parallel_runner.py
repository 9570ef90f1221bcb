"""Tensor parallel over gloo (2 ranks, 1 thread each) against tp = 1 on a tiny random
Llama: greedy tokens equal and logprobs (float32 tolerance) match through a chunked
prefill, a prefix-cache hit (a second request reusing the first's full pages), batched
decodes and prompt logprobs; int4 weights shard at group boundaries; bad sizes and
levers that cannot combine fail at startup with one line."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama, make_tiny_model
from houchu.model.config.load import load_model_config
from houchu.model.quant.functions import QuantSpec
from houchu.runner.model_runner import ModelRunner
from houchu.runner.tensor_parallel.ranks import tp_runner_options
from houchu.runner.tensor_parallel.shards import (
    TensorParallelError,
    check_shardable,
    padded_vocab,
    shard_weights,
)
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

#: float32 sums in another order (row-parallel partial sums): logprobs within this
TOL = 1e-4
SP = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=8, max_tokens=64)
PAGE = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # vocabulary 129: not a multiple of 2, so the vocabulary-parallel rows are padded
    d = tmp_path_factory.mktemp("tp")
    return make_tiny_llama(d, seed=5, vocab_size=129, intermediate_size=128)


def _opts(tp: int, **kw) -> object:
    return exact(page_size=PAGE, num_pages=32, threads=1, tensor_parallel_size=tp, **kw)


def _w(rid: str, ids: list[int], start: int, pages: list[int], sample: bool = True) -> SeqWork:
    return SeqWork(rid=rid, token_ids=ids, start_pos=start, page_table=pages, sample=sample)


def _run(runner: ModelRunner) -> list:
    """A chunked prefill of A, decodes, B hitting A's first two pages, batched decodes,
    a speculative verification step; every step's outputs (token, logprob, top logprobs) and prompt logprobs."""
    a = [5, 17, 99, 3, 42, 8, 120, 64, 7, 11]  # 10 tokens: pages 0, 1, 2
    b = a[:8] + [2, 77, 31]  # its first 8 tokens (2 full pages) are A's
    sp_a = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=8, prompt_logprobs=3)
    steps = [
        StepPlan(
            step_id=0,
            init=[SeqInit(rid="a", sampling=sp_a, prompt_ids=a)],
            work=[_w("a", a[:8], 0, [0, 1], sample=False)],
        ),
        StepPlan(step_id=1, work=[_w("a", a[8:], 8, [0, 1, 2])]),
    ]
    out, toks = [], {"a": [], "b": []}
    for plan in steps:
        out.append(runner.execute(plan))
    toks["a"].append(out[-1].outputs[0].token_id)
    pages = {"a": [0, 1, 2, 3, 6], "b": [0, 1, 4, 5, 7]}
    for i in range(3):  # A decodes alone
        w = _w("a", [toks["a"][-1]], 10 + i, pages["a"])
        out.append(runner.execute(StepPlan(step_id=2 + i, work=[w])))
        toks["a"].append(out[-1].outputs[0].token_id)
    hit = _w("b", b[8:], 8, pages["b"])  # prefix hit
    w = _w("a", [toks["a"][-1]], 13, pages["a"])
    init_b = SeqInit(rid="b", sampling=SP, prompt_ids=b)
    out.append(runner.execute(StepPlan(step_id=5, init=[init_b], work=[w, hit])))
    for o in out[-1].outputs:
        toks[o.rid].append(o.token_id)
    for i in range(3):  # batched decodes
        work = [
            _w("a", [toks["a"][-1]], 14 + i, pages["a"]),
            _w("b", [toks["b"][-1]], 11 + i, pages["b"]),
        ]
        out.append(runner.execute(StepPlan(step_id=6 + i, work=work)))
        for o in out[-1].outputs:
            toks[o.rid].append(o.token_id)
    # speculative verification: B's last token and 3 proposals; tp 2 must accept what
    # tp 1 accepts and sample the same token after them
    proposals = [toks["a"][-1], 9, 9]
    v = SeqWork(
        rid="b",
        token_ids=[toks["b"][-1], *proposals],
        start_pos=14,
        page_table=pages["b"],
        sample=True,
        num_draft=3,
    )
    out.append(runner.execute(StepPlan(step_id=9, work=[v])))
    return out


def _compare(ref: list, got: list, tol: float = TOL) -> None:
    """Tokens equal, logprobs within ``tol``; with ``tol`` at float32's, prompt token
    ranks equal too."""
    for r, g in zip(ref, got, strict=True):
        assert r.error is None and g.error is None, (r.error, g.error)
        assert [o.token_id for o in g.outputs] == [o.token_id for o in r.outputs]
        for ro, go in zip(r.outputs, g.outputs, strict=True):
            assert go.logprob == pytest.approx(ro.logprob, abs=tol)
            if tol == TOL:  # else two near-tied tokens may trade places
                assert [t for t, _ in go.top_logprobs] == [t for t, _ in ro.top_logprobs]
            want = torch.tensor([lp for _, lp in ro.top_logprobs])
            have = torch.tensor([lp for _, lp in go.top_logprobs])
            torch.testing.assert_close(have, want, atol=tol, rtol=0)
        for rp, gp in zip(r.prompt_logprobs, g.prompt_logprobs, strict=True):
            assert (gp.rid, gp.start) == (rp.rid, rp.start)
            assert gp.ranks == rp.ranks or tol > TOL
            assert len(rp.logprobs) > 0
            torch.testing.assert_close(
                torch.tensor(gp.logprobs), torch.tensor(rp.logprobs), atol=tol, rtol=0
            )


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory, tiny_dir):
    """The tiny model of a family (llama: ``tiny_dir``)."""
    made = {"llama": tiny_dir}

    def get(family: str):
        if family not in made:
            d = tmp_path_factory.mktemp(family)
            made[family] = make_tiny_model(d, family, seed=5, vocab_size=129, intermediate_size=128)
        return made[family]

    return get


@pytest.mark.parametrize(
    ("family", "quant"),
    [
        ("llama", "none"),
        ("llama", "int4"),  # groups of 32 cut whole: the same groups as tp 1
        ("llama", "int8"),  # per-row scales over each shard's columns: close, not equal
        ("qwen2", "none"),  # q/k/v biases sharded with their rows
        ("gemma2", "none"),  # norms after the reductions, soft-capping, scaled embedding
    ],
)
def test_tp2_equals_tp1(family_dir, family, quant):
    path = str(family_dir(family))
    ref = _run(ModelRunner(path, _opts(1, quantization=quant), quiet=True))
    tp = ModelRunner(path, _opts(2, quantization=quant), quiet=True)
    try:
        assert tp.tp is not None and tp.tp.world == 2
        assert tp.pool.k.shape[-2] == 1  # [.., Hkv / 2, D]: one of the two KV heads
        got = _run(tp)
        info = tp.info()
        levers = {s.lever: s for s in tp.lever_samples()}
    finally:
        tp.close()
    # quantized layers multiply in bf16 where the CPU has it: sums in another order
    # differ in bf16's last bits, and near-ties among unlikely tokens may swap ranks
    _compare(ref, got, TOL if quant == "none" else 2e-2)
    assert all(g.allreduce_s > 0 for g in got if g.num_tokens)
    assert all(g.allreduce_s < g.duration_s for g in got)
    one = ModelRunner(path, _opts(1, quantization=quant), quiet=True).info()
    assert info.kv_bytes_per_token == one.kv_bytes_per_token  # both ranks' halves
    assert info.num_pages == one.num_pages and info.vocab_size == 129
    assert levers["tensor_parallel"].spent > 0 and levers["tensor_parallel"].saved > 0


@pytest.mark.parametrize(
    ("qtype", "quant"),
    [
        ("F16", "none"),  # columns cut by element
        ("Q8_0", "none"),  # o_proj's 32 and down's 64 input columns per rank: whole blocks
        ("Q4_1", "auto"),  # Q4 blocks kept as int4 (cut, then repacked, per rank)
    ],
)
def test_tp2_equals_tp1_from_gguf(tiny_dir, tmp_path, qtype, quant):
    """Each rank reads its shard of a GGUF file (views cut before dequantizing or
    repacking; q/k rows un-permuted per rank's heads): tp 2 gives tp 1's tokens."""
    from houchu.devtools.gguf_writers import write_llama_gguf

    path = str(write_llama_gguf(tiny_dir, tmp_path / f"m-{qtype}.gguf", qtype=qtype))
    ref = _run(ModelRunner(path, _opts(1, quantization=quant), quiet=True))
    tp = ModelRunner(path, _opts(2, quantization=quant), quiet=True)
    try:
        assert tp.model.quant.mode == ("int4" if quant == "auto" else "none")
        got = _run(tp)
    finally:
        tp.close()
    _compare(ref, got, TOL if quant == "none" else 2e-2)


def test_shard_weights_split_heads_and_vocab(tiny_dir):
    from houchu.model.weights.loader import load_tensors

    cfg, w = load_tensors(tiny_dir, torch.float32)
    q = w["model.layers.0.self_attn.q_proj.weight"].clone()  # [H·D, hidden]
    o = w["model.layers.0.self_attn.o_proj.weight"].clone()  # [hidden, H·D]
    emb = w["model.embed_tokens.weight"].clone()  # [V, hidden]
    shard_weights(cfg, w, 1, 2)
    half = cfg.num_heads * cfg.head_dim // 2
    assert torch.equal(w["model.layers.0.self_attn.q_proj.weight"], q[half:])
    assert torch.equal(w["model.layers.0.self_attn.o_proj.weight"], o[:, half:])
    e = w["model.embed_tokens.weight"]  # rows 65 .. 129 of the padded vocabulary
    assert e.shape == (padded_vocab(129, 2) // 2, cfg.hidden_size)
    assert torch.equal(e[:-1], emb[65:]) and not e[-1].any()


def test_indivisible_sizes_fail_with_one_line(tiny_dir):
    cfg = load_model_config(tiny_dir)  # 4 heads, 2 KV heads, MLP 128
    with pytest.raises(TensorParallelError, match=r"KV heads \(2\) not divisible by 4"):
        check_shardable(cfg, 4, QuantSpec())
    with pytest.raises(TensorParallelError, match="heads"):
        check_shardable(cfg, 3, QuantSpec())
    with pytest.raises(TensorParallelError, match="group size 128 does not divide"):
        check_shardable(cfg, 2, QuantSpec("int4", 128))
    check_shardable(cfg, 2, QuantSpec("int4", 32))


def test_levers_that_cannot_combine_are_refused():
    with pytest.raises(TensorParallelError, match="--compile on"):
        tp_runner_options(exact(tensor_parallel_size=2, compile="on"))
    with pytest.raises(TensorParallelError, match="CPU cores"):
        tp_runner_options(exact(tensor_parallel_size=4096))
    o, notes = tp_runner_options(exact(tensor_parallel_size=2, compile="auto"))
    assert o.compile == "off" and o.disable_fused_layers and o.fixed_threads
    assert len(notes) == 1 and "2 ranks (gloo)" in notes[0]


@pytest.mark.multi_gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="NCCL tensor parallel needs 2 or more CUDA GPUs",
)
def test_tp2_nccl_equals_tp1(tiny_dir):
    cuda = {"device": "cuda", "attention_backend": "torch", "disable_cuda_graph": True}
    ref = _run(ModelRunner(str(tiny_dir), _opts(1, **cuda), quiet=True))
    tp = ModelRunner(str(tiny_dir), _opts(2, **cuda), quiet=True)
    try:
        got = _run(tp)
    finally:
        tp.close()
    _compare(ref, got)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--host-kv-mb", "64"], "does not combine with the KV tiers"),
        (["--data-parallel-size", "2"], "does not combine with --data-parallel-size"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
    ],
)
def test_serve_refuses_what_tp_cannot_combine_with(extra, message, capsys):
    from houchu.cli.main import build_parser
    from houchu.options.checks import check_serve_args

    parser = build_parser()
    args = parser.parse_args(["serve", "--tensor-parallel-size", "2", *extra])
    with pytest.raises(SystemExit) as e:
        check_serve_args(parser, args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_serve_check_names_the_sizes_that_fit(tiny_dir, monkeypatch):
    from houchu.options.checks import check_tensor_parallel

    monkeypatch.setenv("HOUCHU_TP_OVERSUBSCRIBE", "1")  # 4 ranks on fewer cores: allowed

    why = check_tensor_parallel(exact(tensor_parallel_size=4), str(tiny_dir))
    assert why is not None and "KV heads (2) not divisible by 4; sizes that divide them: [2]" in why
    assert check_tensor_parallel(exact(tensor_parallel_size=2), str(tiny_dir)) is None
    assert check_tensor_parallel(exact(), str(tiny_dir)) is None
