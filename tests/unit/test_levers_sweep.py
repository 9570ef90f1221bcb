"""houchu levers' sweep logic on recorded measurement data: the plan toggles the levers
as asked, medians and noise, break-even interpolation on synthetic curves, composition
verdicts and the recommendation (the roofline and the answers: test_levers_records)."""

from __future__ import annotations

import math

import pytest

from houchu.bench.sweep.analysis import (
    break_even,
    compose,
    gain,
    recommend,
    summarize_cells,
)
from houchu.bench.sweep.levers import LEVERS, Machine, can_pair, lever
from houchu.bench.sweep.plan import Config, Load, build_plan, merge_flags, parse_loads
from tests.support.levers import CPU, LOADS, SERVE_FLAGS, run

# ------------------------------------------------------------------ the plan


def test_configs_toggle_each_lever_as_asked():
    plan = build_plan(["radix-cache", "int4", "int8-kv"], "all", LOADS, 1, CPU)
    names = [c.name for c in plan.configs()]
    assert names == [
        "baseline",
        "defaults",  # houchu serve with no lever flag: what a recommendation is judged against
        "radix-cache",
        "int4",
        "int8-kv",
        "int4+radix-cache",
        "int8-kv+radix-cache",
        "int4+int8-kv",
    ]
    base = plan.flags(Config(frozenset()))
    assert base == ["--disable-radix-cache", "--quantization", "none", "--kv-cache-dtype", "auto"]
    assert plan.flags(Config(frozenset(), defaults=True)) == []
    without = build_plan(["radix-cache", "int4"], "none", LOADS, 1, CPU, defaults=False)
    assert [c.name for c in without.configs()] == ["baseline", "radix-cache", "int4"]
    assert plan.flags(Config(frozenset({"int4"}))) == [
        "--disable-radix-cache",
        "--quantization",
        "int4",
        "--kv-cache-dtype",
        "auto",
    ]
    both = plan.flags(Config(frozenset({"radix-cache", "int8-kv"})))
    assert both == ["--quantization", "none", "--kv-cache-dtype", "int8"]


def test_levers_sharing_a_flag_do_not_pair_and_shared_off_flags_merge():
    assert not can_pair(lever("int4"), lever("int8"))
    assert can_pair(lever("int4"), lever("int8-kv"))
    plan = build_plan(["int4", "int8"], "all", LOADS, 1, CPU)
    assert plan.pairs == []
    assert "int4+int8" in plan.skipped_pairs
    assert plan.flags(Config(frozenset())) == ["--quantization", "none"]
    assert plan.flags(Config(frozenset({"int8"}))) == ["--quantization", "int8"]


def test_a_lever_on_sets_the_flag_it_shares_with_levers_off():
    """int4 on beside int8 off (both ``--quantization``), int8-kv on beside fp8-kv off
    (both ``--kv-cache-dtype``): the lever that is on sets the value, whatever the
    order of the levers."""
    names = ["int4", "int8", "int8-kv", "fp8-kv"]
    for order in (names, names[::-1]):
        plan = build_plan(order, "none", LOADS, 1, CPU)
        assert _value(plan.flags(Config(frozenset({"int4"}))), "--quantization") == "int4"
        assert _value(plan.flags(Config(frozenset({"int8"}))), "--quantization") == "int8"
        assert _value(plan.flags(Config(frozenset())), "--quantization") == "none"
        kv = plan.flags(Config(frozenset({"int8-kv"})))
        assert _value(kv, "--kv-cache-dtype") == "int8" and kv.count("--kv-cache-dtype") == 1
        assert _value(plan.flags(Config(frozenset({"fp8-kv"}))), "--kv-cache-dtype") == "fp8"


def _value(flags: list[str], flag: str) -> str:
    return flags[flags.index(flag) + 1]


def test_not_applicable_levers_are_listed_with_the_reason():
    smollm = "--tensor-parallel-size 2: 'x' has attention heads (9), KV heads (3) not divisible"
    cpu = Machine("cpu", frozenset({"avx2", "fma"}), SERVE_FLAGS, tp_refusal=smollm)
    plan = build_plan(
        ["w8a8", "cuda-graph", "spec-draft", "tensor-parallel", "moe"], "all", LOADS, 1, cpu
    )
    assert plan.levers == []
    na = plan.not_applicable
    assert "int8 dot products" in na["w8a8"]
    assert "CUDA" in na["cuda-graph"]
    assert "draft model" in na["spec-draft"]
    assert "not divisible" in na["tensor-parallel"]
    assert build_plan(["tensor-parallel"], "none", LOADS, 1, CPU).levers[0].name == (
        "tensor-parallel"
    )  # a model whose heads divide by 2
    assert "structure" in na["moe"]
    vnni = Machine("cpu", frozenset({"avx512_vnni"}), SERVE_FLAGS, draft_model="/d.gguf")
    plan = build_plan(["w8a8", "spec-draft"], "none", LOADS, 1, vnni)
    assert [lv.name for lv in plan.levers] == ["w8a8", "spec-draft"]
    assert plan.flags(Config(frozenset({"spec-draft"}))) == [
        "--quantization",
        "none",
        "--draft-model",
        "/d.gguf",
    ]


def test_every_lever_flag_is_a_serve_flag_or_reported_missing():
    for lv in LEVERS:
        why = lv.applicable(CPU)
        missing = lv.flag_names() - SERVE_FLAGS
        assert (why is not None) if missing else True, lv.name
        assert lv.bottleneck


def test_interacting_and_explicit_pairs():
    plan = build_plan(["radix-cache", "chunked-prefill", "int4"], "interacting", LOADS, 1, CPU)
    assert plan.pairs == [("radix-cache", "chunked-prefill")]
    plan = build_plan(["radix-cache", "int4"], "int4+radix-cache", LOADS, 1, CPU)
    assert plan.pairs == [("radix-cache", "int4")]
    with pytest.raises(ValueError, match="not among"):
        build_plan(["radix-cache"], "radix-cache+int4", LOADS, 1, CPU)
    with pytest.raises(ValueError, match="unknown lever"):
        build_plan(["nope"], "none", LOADS, 1, CPU)
    with pytest.raises(ValueError, match="repeats"):
        build_plan(["int4"], "none", LOADS, 0, CPU)


def test_parse_loads_and_merge_flags():
    assert [ld.value for ld in parse_loads("16,1,4", None)] == [1, 4, 16]
    assert parse_loads(None, "0.5,2")[0] == Load("rate", 0.5)
    for bad in (("0,1", None), ("1.5", None), ("x", None), (None, None), ("1", "1")):
        with pytest.raises(ValueError):
            parse_loads(*bad)
    assert merge_flags([("--a", "1", "--b"), ("--a", "2")]) == ["--a", "2", "--b"]
    with pytest.raises(ValueError):
        merge_flags([("1",)])


# ------------------------------------------------------------------ analysis


def test_medians_and_spread_of_repeats():
    runs = [run("baseline", 4, t, repeat=i) for i, t in enumerate((90.0, 100.0, 120.0))]
    cells = summarize_cells(runs)
    c = cells["baseline", 4]
    assert c.metrics["output_throughput"] == 100.0
    assert c.spread == pytest.approx(0.3)
    assert c.repeats == 3


def test_gain_is_above_one_when_better_for_each_metric():
    cells = summarize_cells(
        [
            run("baseline", 1, 100.0, ttft=200.0, tpot=20.0),
            run("x", 1, 150.0, ttft=100.0, tpot=40.0),
        ]
    )
    on, base = cells["x", 1], cells["baseline", 1]
    assert gain(on, base) == pytest.approx(1.5)
    assert gain(on, base, "median_ttft_ms") == pytest.approx(2.0)
    assert gain(on, base, "median_tpot_ms") == pytest.approx(0.5)


def test_break_even_interpolates_in_log_load():
    loads = [1.0, 4.0, 16.0, 64.0]
    be = break_even(loads, [1.5, 1.2, 0.8, 0.6])
    assert be.kind == "stops"
    # between 4 (1.2) and 16 (0.8): halfway in log space -> 8
    assert be.load == pytest.approx(8.0)
    be = break_even(loads, [0.9, 0.95, 1.05, 1.2])
    assert be.kind == "starts"
    assert be.load == pytest.approx(math.exp(math.log(4) + 0.5 * (math.log(16) - math.log(4))))
    assert break_even(loads, [1.1, 1.2, 1.3, 1.01]).kind == "always"
    assert break_even(loads, [1.0, 0.9, 0.8, 0.7]).kind == "never"  # exactly 1 does not pay
    assert break_even(loads, [None] * 4).kind == "unknown"
    assert break_even(loads, [1.2, None, 0.8, None]).load == pytest.approx(4.0)


def test_composition_verdicts_follow_from_the_numbers():
    assert compose("a", "b", 1.2, 1.5, 1.8, 0.0).verdict == "add"  # 1.8 = 1.2 * 1.5
    assert compose("a", "b", 1.2, 1.5, 1.6, 0.0).verdict == "overlap"  # < product, > best
    assert compose("a", "b", 1.2, 1.5, 1.3, 0.0).verdict == "cancel"  # below the best single
    assert compose("a", "b", 1.2, 1.5, 2.2, 0.0).verdict == "synergy"
    c = compose("a", "b", 1.2, 1.5, 1.6, 0.2)  # within a wide noise tolerance: add
    assert c.verdict == "add" and c.ratio == pytest.approx(1.6 / 1.8)
    assert compose("a", "b", 1.0, 1.0, 1.02, 0.0).verdict == "add"  # MIN_TOLERANCE
    assert compose("a", "b", 1.2, 1.5, 1.3, 0.6).verdict == "noisy"  # repeats too spread
    with pytest.raises(ValueError):
        compose("a", "b", 0.0, 1.0, 1.0, 0.0)


def test_recommendation_picks_the_best_measured_configuration():
    runs = [
        run("baseline", 16, 100.0),
        run("int4", 16, 180.0),
        run("int4+int8-kv", 16, 200.0, failed=1),  # failed requests: not recommended
        run("radix-cache", 16, 150.0),
        run("int4", 1, 10.0),
    ]
    cells = summarize_cells(runs)
    rec = recommend(cells, 16)
    assert rec.config == "int4" and rec.gain == pytest.approx(1.8)
    lat = recommend(
        summarize_cells([run("baseline", 1, 1, ttft=50), run("x", 1, 1, ttft=40)]),
        1,
        "median_ttft_ms",
    )
    assert lat.config == "x"
    assert recommend(cells, 64) is None
    with pytest.raises(ValueError):
        recommend(cells, 16, "nope")


def test_a_lever_that_requires_another_runs_with_it_and_is_measured_against_it():
    """The host KV tier sits below the radix cache: with radix-cache swept (off in the
    baseline) kv-tiers runs with it on, its gains come from radix-cache alone, and the
    pair of the two is no pair."""
    plan = build_plan(["radix-cache", "kv-tiers"], "interacting", LOADS, 1, CPU)
    names = [c.name for c in plan.configs()]
    assert names == ["baseline", "defaults", "radix-cache", "kv-tiers"]
    assert (
        plan.pairs == []
        and "kv-tiers runs with radix-cache on" in (plan.skipped_pairs["radix-cache+kv-tiers"])
    )
    tiers = plan.flags(Config(frozenset({"kv-tiers"})))
    assert "--disable-radix-cache" not in tiers and tiers[-2:] == ["--host-kv-mb", "512"]
    assert plan.reference("kv-tiers") == Config(frozenset({"radix-cache"}))
    assert plan.reference("radix-cache") == Config(frozenset())
    alone = build_plan(["kv-tiers"], "none", LOADS, 1, CPU)  # radix on in the baseline
    assert [c.name for c in alone.configs()] == ["baseline", "defaults", "kv-tiers"]
    assert alone.reference("kv-tiers") == Config(frozenset())


def test_data_parallel_is_listed_as_not_measured_by_the_sweep():
    plan = build_plan(["int4", "data-parallel"], "none", LOADS, 1, CPU)
    assert "houchu.bench.served.replicas" in plan.not_applicable["data-parallel"]


def test_serve_args_may_not_set_a_swept_levers_flag():
    """``--serve-args`` setting a lever's own flag would turn it on or off behind the
    sweep's back: refused in one line naming both (found by a review)."""
    from houchu.bench.sweep.cli import check_serve_args

    plan = build_plan(["radix-cache", "int4"], "none", LOADS, 1, CPU)
    with pytest.raises(ValueError, match="--disable-radix-cache: the lever radix-cache"):
        check_serve_args(["--disable-radix-cache"], plan)
    with pytest.raises(ValueError, match="--quantization: the lever int4"):
        check_serve_args(["--quantization=int8"], plan)
    check_serve_args(["--kv-cache-mb", "64", "--compile", "off"], plan)  # not swept: fine
    with pytest.raises(ValueError, match="houchu serve refuses them"):  # every start fails
        check_serve_args(["--quant", "int8"], plan)


def test_jump_forward_applies_to_a_structured_workload():
    """Jump-forward acts on constrained requests only: not applicable (with the way to
    make it apply) unless the workload sends them (``--structured``)."""
    import dataclasses

    free = build_plan(["jump-forward"], "none", LOADS, 1, CPU)
    assert "--structured" in free.not_applicable["jump-forward"]
    structured = dataclasses.replace(CPU, structured=True)
    plan = build_plan(["jump-forward"], "none", LOADS, 1, structured)
    assert [lv.name for lv in plan.levers] == ["jump-forward"]
    assert plan.flags(Config(frozenset({"jump-forward"}))) == ["--jump-forward", "on"]
