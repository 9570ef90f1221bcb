"""The model-runner benchmark's accounting (``houchu.bench.model.runner``): the ops a
prefill counts (the LM head on its last token only) and %peak against the peak of the
format each part of a step computes in."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.bench.model import runner as runner_bench
from houchu.bench.model.limits import Limits
from houchu.bench.model.runner import Bench, Row, print_table
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.linear.w8a8 import int_mm_pays
from houchu.runner.model_runner import ModelRunner
from tests.support.runner_options import exact

LIMITS = Limits(copy_gbs=40.0, fp32_flops=200e9, bf16_flops=400e9, int8_ops=800e9)


def peak_column(capsys: pytest.CaptureFixture[str], row: Row, **kw: Any) -> float:
    print_table([row], LIMITS, header=False, **kw)
    return float(capsys.readouterr().out.split()[-1])


def test_prefill_counts_the_lm_head_once(tmp_path):
    path = make_tiny_llama(tmp_path)
    runner = ModelRunner(str(path), exact(page_size=4, num_pages=16), quiet=True)
    b = Bench(runner, context=4)
    row = b.prefill(20, reps=1)
    cfg = runner.config
    head = cfg.vocab_size * cfg.hidden_size
    layers = sum(m.out_features * m.in_features for m in runner.model.linears()) - head
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 20 * 21 // 2
    assert row.attn_flops == attn
    assert row.flops == 2 * (layers * 20 + head) + attn
    assert row.tokens == 20 and row.step_s > 0


def test_peak_charges_each_part_at_its_format(capsys):
    w8a8 = Row("w8a8", "eager", "prefill 512", 4.0, 512, 1e6, 1.2e12, 0.4e12)
    # where W8A8's int8 GEMM runs: 0.8e12 int8 GEMM ops at the int8 peak (1 s) + 0.4e12
    # of attention at the bf16 one (1 s): 2 s ideal / 4 s
    assert peak_column(capsys, w8a8, w8a8_gemm=lambda: "int8") == pytest.approx(50.0, abs=0.05)
    # where it does not (no int8 dot products, or slower than the dense matmul), its
    # rows run weight-only: everything at the bf16 peak (1.2e12 / 400e9 = 3 s of 4 s)
    assert peak_column(capsys, w8a8, w8a8_gemm=lambda: None) == pytest.approx(75.0, abs=0.05)
    # by default the one or the other, as this CPU's probe found (``int_mm_pays``, which
    # the serving layers follow too): never int8's peak on a CPU that has no int8 GEMM
    want = 50.0 if int_mm_pays() else 75.0
    assert peak_column(capsys, w8a8) == pytest.approx(want, abs=0.05)
    # bf16: everything at the bf16 peak (3 s of 4 s)
    bf16 = Row("bf16", "eager", "prefill 512", 4.0, 512, 1e6, 1.2e12, 0.4e12)
    assert peak_column(capsys, bf16) == pytest.approx(75.0, abs=0.05)
    # w8a8 below W8A8_MIN_ROWS runs the weight-only kernel, even where the int8 GEMM
    # runs from there on: bf16's peak
    small = Row("w8a8", "eager", "decode b=8", 4.0, 8, 1e6, 1.2e12, 0.4e12)
    assert runner_bench.W8A8_MIN_ROWS > 8
    assert peak_column(capsys, small, w8a8_gemm=lambda: "int8") == pytest.approx(75.0, abs=0.05)


def test_peak_only_against_units_the_cpu_has(capsys):
    """No %peak for a format the level computes without a native unit (an AVX2 CPU's
    bfloat16 and int8); a row computing in float32 is charged at the fp32 peak."""
    bf16 = Row("bf16", "eager", "decode b=1", 4.0, 1, 1e6, 1.2e12, 0.4e12)
    print_table([bf16], LIMITS, header=False, units=frozenset({"fp32"}))
    assert capsys.readouterr().out.split()[-1] == "-"
    int4 = Row("int4", "eager", "decode b=1", 4.0, 1, 1e6, 0.8e12, 0.0, compute="fp32")
    print_table([int4], LIMITS, header=False, units=frozenset({"fp32"}))
    assert float(capsys.readouterr().out.split()[-1]) == pytest.approx(100.0, abs=0.05)


def test_native_units_follow_the_level():
    from houchu.cpu import isa as cpu_isa

    avx512 = frozenset(
        "avx avx2 fma f16c bmi1 bmi2 abm movbe avx512f avx512bw avx512vl avx512dq "
        "avx512cd avx512_bf16 avx512_vnni".split()
    )
    avx2_vnni = frozenset("avx avx2 fma f16c bmi1 bmi2 abm movbe avx_vnni".split())
    assert cpu_isa.native_units("avx512_bf16", avx512) == {"fp32", "bf16", "int8"}
    assert cpu_isa.native_units("avx2", avx512) == {"fp32"}  # forced below the best
    assert cpu_isa.native_units("avx2_vnni", avx2_vnni) == {"fp32", "int8"}  # its best
    assert cpu_isa.native_units("avx2", avx2_vnni) == {"fp32"}  # forced below the best
    # forced below the best, a level keeps what its own features give: AVX-VNNI's int8
    assert cpu_isa.native_units("avx2_vnni", avx512 | {"avx_vnni"}) == {"fp32", "int8"}
    assert cpu_isa.native_units("avx512", avx512) == {"fp32"}  # no VNNI, no BF16 there
    assert cpu_isa.torch_env_for("avx2", avx512)["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert cpu_isa.torch_env_for("avx2_vnni", avx2_vnni) == {}
    assert cpu_isa.torch_env_for("avx2", avx2_vnni)["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_decode_reports_best_and_median_after_warmup(tmp_path, capsys):
    path = make_tiny_llama(tmp_path)
    runner = ModelRunner(str(path), exact(page_size=4, num_pages=64), quiet=True)
    b = Bench(runner, context=4)
    calls = []
    run = runner.execute
    runner.execute = lambda plan: calls.append(plan) or run(plan)  # type: ignore[method-assign]
    row = b.decode(2, steps=5)
    timed = [p for p in calls if p.work and all(w.token_ids == [11] for w in p.work)]
    assert len(timed) == runner_bench.WARMUP_STEPS + 5  # the warm-up steps are not timed
    assert 0 < row.step_s <= row.med_s
    row.fmt, row.mode, row.kernels = "int4", "eager", "avx2 fused"
    print_table([row], LIMITS, header=False)
    # the table's row (the runner's thread governor may print beside it on busy cores)
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("int4 ")]
    cols = line.split()
    assert float(cols[7]) == pytest.approx(row.step_s * 1e3, abs=0.01)  # ms/step: the best
    assert float(cols[8]) == pytest.approx(row.med_s * 1e3, abs=0.01)  # med ms


def test_on_cuda_w8a8_is_rated_as_fp8_without_the_cpu_probe(capsys):
    """On a GPU w8a8's GEMMs run FP8 from W8A8_MIN_ROWS rows: no FP8 peak is measured, so
    "-", not a rate against the int8 peak; the CPU's ``int_mm_pays`` is never asked; int8
    (a GPU without FP8) is rated against the int8 peak."""
    from houchu.bench.model.runner import GPU_UNITS, cuda_w8a8_gemm
    from houchu.model.linear.w8a8 import int_mm_pays

    assert (cuda_w8a8_gemm((9, 0)), cuda_w8a8_gemm((8, 9))) == ("fp8", "int8")
    w8a8 = Row("w8a8", "graph", "prefill 512", 4.0, 512, 1e6, 1.2e12, 0.4e12)
    probed = int_mm_pays.cache_info()
    print_table([w8a8], LIMITS, header=False, units=GPU_UNITS, w8a8_gemm=lambda: "fp8")
    assert capsys.readouterr().out.split()[-1] == "-"
    assert int_mm_pays.cache_info() == probed  # the CPU probe was not called
    print_table([w8a8], LIMITS, header=False, units=GPU_UNITS, w8a8_gemm=lambda: "int8")
    assert float(capsys.readouterr().out.split()[-1]) == pytest.approx(50.0, abs=0.05)
    bf16 = Row("bf16", "graph", "prefill 512", 4.0, 512, 1e6, 1.2e12, 0.4e12)
    print_table([bf16], LIMITS, header=False, units=GPU_UNITS, w8a8_gemm=lambda: "fp8")
    assert float(capsys.readouterr().out.split()[-1]) == pytest.approx(75.0, abs=0.05)
