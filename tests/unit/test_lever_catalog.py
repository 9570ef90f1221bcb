"""The lever catalog (``houchu.transport.levers``): every sample the code base emits names
a catalog lever through the enums, in units the catalog lists; a cost no counter measures
is ``Unit.NONE``, never 0 in some unit; the dashboard lists every lever with its cost;
the stored history of older names is migrated."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import text

from houchu.bench.sweep.levers import LEVERS
from houchu.dashboard.lever_catalog import VERB_IDS, ledger_by_verb
from houchu.runner.lever_counters import LeverCounters, StepCost
from houchu.speculative.ledger import SpecCounters
from houchu.storage.db import create_db_engine, migrate
from houchu.storage.lever_names import current_lever
from houchu.transport.levers import (
    CATALOG,
    HALF_PRECISION_LEVERS,
    KV_QUANT_LEVERS,
    TIER_LEVERS,
    VERBS,
    WEIGHT_QUANT_LEVERS,
    Lever,
    Unit,
    Verb,
)
from houchu.transport.telemetry import LeverSample, TelemetryBatch

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = [
    p
    for p in ROOT.rglob("*.py")
    if not {"tests", ".venv", "build", "houchu.egg-info"} & set(p.relative_to(ROOT).parts)
]
#: LeverSample's fields that must come from the catalog's enums, by position.
ENUM_FIELDS = {0: "lever", 1: "verb", 3: "saved_unit", 5: "spent_unit"}


def _lever_sample_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name == "LeverSample":
                yield node


def _enum_args(call: ast.Call) -> dict[str, ast.expr]:
    out = {ENUM_FIELDS[i]: a for i, a in enumerate(call.args) if i in ENUM_FIELDS}
    out |= {k.arg: k.value for k in call.keywords if k.arg in ENUM_FIELDS.values()}
    return out


def test_no_lever_sample_is_built_from_string_literals():
    bad = []
    for path in RUNTIME:
        tree = ast.parse(path.read_text(), str(path))
        for call in _lever_sample_calls(tree):
            for field, arg in _enum_args(call).items():
                if isinstance(arg, (ast.Constant, ast.JoinedStr)):
                    bad.append(f"{path.relative_to(ROOT)}:{call.lineno} {field}")
    assert not bad, f"LeverSample fields given as strings, not catalog enums: {bad}"
    assert len([p for p in RUNTIME if "LeverSample(" in p.read_text()]) >= 10  # the scan ran


def test_every_enum_member_the_code_names_exists_and_units_match_the_catalog():
    """``Lever.X`` / ``Verb.X`` / ``Unit.X`` written in runtime code (where imported from
    the catalog) exist; a LeverSample naming its lever and units as members uses units
    its lever's spec lists (``Unit.NONE`` for a spent amount it does not measure)."""
    enums = {"Lever": Lever, "LedgerLever": Lever, "Verb": Verb, "Unit": Unit}
    missing, wrong = [], []
    for path in RUNTIME:
        src = path.read_text()
        if "houchu.transport.levers import" not in src:
            continue
        tree = ast.parse(src, str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in enums
                and node.attr.isupper()
                and not hasattr(enums[node.value.id], node.attr)
            ):
                missing.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}"
                )
        for call in _lever_sample_calls(tree):
            args = {
                k: getattr(Lever if k == "lever" else Verb if k == "verb" else Unit, v.attr)
                for k, v in _enum_args(call).items()
                if isinstance(v, ast.Attribute)
                and isinstance(v.value, ast.Name)
                and v.value.id in enums
            }
            if "lever" not in args:
                continue
            spec = CATALOG[args["lever"]]
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            if "verb" in args and args["verb"] not in spec.verbs:
                wrong.append(f"{where} verb")
            if "saved_unit" in args and args["saved_unit"] not in spec.saved_units:
                wrong.append(f"{where} saved_unit")
            if "spent_unit" in args and args["spent_unit"] not in (*spec.spent_units, Unit.NONE):
                wrong.append(f"{where} spent_unit")
    assert not missing and not wrong, (missing, wrong)


def _check_units(s: LeverSample) -> None:
    spec = CATALOG[s.lever]
    assert s.verb in spec.verbs, s
    assert s.saved_unit in spec.saved_units, s
    if spec.spent_measured:
        assert s.spent_unit in (*spec.spent_units, Unit.NONE), s
    else:  # a cost no counter measures is never reported as 0 in some unit
        assert (s.spent_unit, s.spent) == (Unit.NONE, 0.0), s


@pytest.mark.parametrize("weight", ["none", "int4-g32", "int4-g128-gptq", "int8", "w8a8"])
@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
@pytest.mark.parametrize("half", ["", "bf16", "fp16"])
def test_the_runners_counters_emit_catalog_levers_in_catalog_units(weight, kv, half):
    c = LeverCounters(StepCost(500, 1000, 32, 64, weight, kv, half, 8), "cuda_graph", 0.02, 0.01)
    c.record(kv_written=4, kv_read=10, accelerated=True, score_pairs=10)
    samples = c.samples(now=1.0)
    assert samples
    for s in samples:
        _check_units(s)
    names = {s.lever for s in samples}
    if weight != "none":
        assert WEIGHT_QUANT_LEVERS[weight.split("-")[0]] in names
    if kv != "auto":
        assert KV_QUANT_LEVERS[kv] in names
    assert Lever.CUDA_GRAPH in names and Lever.FLASH_ATTENTION in names


def test_int4_spends_dequantization_work_not_zero_bytes():
    c = LeverCounters(StepCost(300, 1000, 64, 64, "int4-g32", "auto", ""))
    c.record(kv_written=1, kv_read=1, accelerated=False)
    (s,) = [s for s in c.samples(now=1.0) if s.lever == Lever.WEIGHT_QUANT_INT4]
    assert s.saved == 700.0 and s.spent_unit == Unit.NONE
    spec = CATALOG[Lever.WEIGHT_QUANT_INT4]
    assert "dequantization" in spec.spends and not spec.spent_measured


def test_speculation_samples_are_catalog_levers():
    c = SpecCounters()
    c.on_verify(proposed=4, accepted=2, emitted=3)
    c.draft_s = 0.01
    for lever in (Lever.SPECULATIVE_DECODING, Lever.MTP):
        for s in c.samples("r1", now=1.0, lever=lever):
            _check_units(s)


def test_lever_sample_checks_names_at_construction_and_decode():
    s = LeverSample("radix_prefix_cache", "skip", 1.0, "tokens", 1.0, "pages", 1.0)
    assert s.lever is Lever.RADIX_PREFIX_CACHE and s.verb is Verb.SKIP
    assert s.saved_unit is Unit.TOKENS
    with pytest.raises(ValueError):
        LeverSample("prefix_cache", Verb.SKIP, 1.0, Unit.TOKENS, 0.0, Unit.NONE, 1.0)
    with pytest.raises(ValueError, match="reports under"):
        LeverSample(Lever.PAGED_KV, Verb.SKIP, 1.0, Unit.BYTES, 0.0, Unit.NONE, 1.0)
    batch = TelemetryBatch(actor="a", levers=[s])
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=TelemetryBatch) == batch
    raw["levers"][0][0] = "no_such_lever"
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=TelemetryBatch)


def test_catalog_is_complete_and_says_what_each_lever_costs():
    assert set(CATALOG) == set(Lever)
    assert [v.verb for v in VERBS] == list(Verb)
    for lever, spec in CATALOG.items():
        assert spec.lever is lever and spec.verbs and spec.title and spec.line
        assert spec.saves and spec.spends, lever
        assert spec.reported or not spec.spent_units, lever
    # the variant maps cover every mode the options allow
    assert set(WEIGHT_QUANT_LEVERS) == {"int4", "int8", "w8a8"}
    assert set(KV_QUANT_LEVERS) == {"int8", "fp8"} and set(TIER_LEVERS) == {"host", "ssd"}
    assert set(HALF_PRECISION_LEVERS) == {"bf16", "fp16"}
    flash = CATALOG[Lever.FLASH_ATTENTION].spends
    assert "no extra work in serving" in flash and not CATALOG[Lever.FLASH_ATTENTION].spent_measured


def test_the_dashboard_lists_every_lever_with_its_cost():
    verbs = ledger_by_verb([])
    assert [v["verb"] for v in verbs] == list(VERB_IDS)
    listed = {(v["verb"], lv["lever"]): lv for v in verbs for lv in v["levers"]}
    assert set(listed) == {(vb.value, s.lever.value) for s in CATALOG.values() for vb in s.verbs}
    for (_, name), entry in listed.items():
        spec = CATALOG[Lever(name)]
        assert not entry["active"] and entry["spends"] == spec.spends
        assert entry["spent_measured"] == spec.spent_measured
    int4 = listed[("move_less", "weight_quant_int4")]
    assert not int4["spent_measured"] and "dequantization" in int4["spends"]


def test_a_reported_lever_fills_its_entry_and_unmeasured_spent_stays_empty():
    row = {"lever": "weight_quant_int4", "verb": "move_less", "saved_unit": "bytes"}
    row |= {"spent_unit": "", "saved": 3e9, "spent": 0.0, "saved_max": 1e9, "spent_max": 0.0}
    row |= {"samples": 3, "last_t": 2.0}
    verbs = {v["verb"]: {lv["lever"]: lv for lv in v["levers"]} for v in ledger_by_verb([row])}
    int4 = verbs["move_less"]["weight_quant_int4"]
    assert int4["active"] and int4["saved"]["bytes"]["sum"] == 3e9 and int4["spent"] == {}


def test_dashboard_scripts_name_no_lever():
    static = ROOT / "dashboard" / "static"
    for js in static.glob("*.js"):
        src = js.read_text()
        named = [lv.value for lv in Lever if f'"{lv.value}"' in src or f"'{lv.value}'" in src]
        assert not named, (js.name, named)


def test_sweep_levers_report_as_catalog_levers():
    for lv in LEVERS:
        assert all(isinstance(n, Lever) for n in lv.ledger), lv.name
        assert lv.verb in VERB_IDS
    assert current_lever("weight_quant_int4-g128-gptq") == "weight_quant_int4"
    assert current_lever("kv_tier_host") == "kv_tier_host"


def test_migration_maps_older_lever_names_and_placeholder_costs(tmp_path):
    e = create_db_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate(e, "0003")
    samples = [
        ("weight_quant_int4-g32", "move_less", 5.0, "bytes", 0.0, "bytes"),
        ("weight_quant_int4-g128", "move_less", 7.0, "bytes", 0.0, "bytes"),
        ("mla", "occupy_less", 9.0, "tokens", 0.0, "tokens"),
        ("radix_prefix_cache", "skip", 4.0, "tokens", 1.0, "pages"),
    ]
    with e.begin() as c:
        for i, (lv, vb, sv, su, sp, pu) in enumerate(samples):
            c.execute(
                text(
                    "INSERT INTO lever_samples (lever, verb, saved, saved_unit, spent, spent_unit,"
                    " t, rid, actor) VALUES (:l, :v, :s, :su, :p, :pu, :t, NULL, 'runner')"
                ),
                {"l": lv, "v": vb, "s": sv, "su": su, "p": sp, "pu": pu, "t": float(i)},
            )
            c.execute(
                text(
                    "INSERT INTO ledger_totals (lever, verb, saved_unit, spent_unit, saved, spent,"
                    " saved_max, spent_max, samples, first_t, last_t) VALUES (:l, :v, :su, :pu,"
                    " :s, :p, :s, :p, 1, :t, :t)"
                ),
                {"l": lv, "v": vb, "s": sv, "su": su, "p": sp, "pu": pu, "t": float(i)},
            )
    migrate(e)
    with e.connect() as c:
        got = sorted(c.execute(text("SELECT lever, spent_unit FROM lever_samples")).all())
        totals = {
            r[0]: r[1:]
            for r in c.execute(
                text(
                    "SELECT lever, spent_unit, saved, saved_max, samples, first_t, last_t FROM ledger_totals"
                )
            )
        }
    assert got == [
        ("mla", ""),
        ("radix_prefix_cache", "pages"),
        ("weight_quant_int4", ""),
        ("weight_quant_int4", ""),
    ]
    assert totals["weight_quant_int4"] == ("", 12.0, 7.0, 2, 0.0, 1.0)
    assert totals["radix_prefix_cache"] == ("pages", 4.0, 4.0, 1, 3.0, 3.0)
    assert totals["mla"][0] == ""
    e.dispose()
