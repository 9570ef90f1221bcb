"""The ledger view: the six verbs and every lever of the catalog, with what each reported.

The words come from the lever catalog (``houchu.transport.levers``), the one the emitters
build their samples from: each lever's title, its line, what it saves and what it spends
in serving, and whether that cost is measured (``spent_measured``: when it is not, the
dashboard says "not measured" instead of an amount). Every catalog lever is listed under
each verb it reports under, greyed until it reports, so the ledger shows what exists. A
row whose lever or verb this build's catalog does not know (a database written by
another version) is shown too, with a generic line.
"""

from __future__ import annotations

from typing import Any

from houchu.transport.levers import CATALOG, VERBS, Lever, LeverSpec

#: The verbs' ids in the ledger's order (cheapest first).
VERB_IDS = tuple(v.verb.value for v in VERBS)


def _spec(lever: str) -> LeverSpec | None:
    try:
        return CATALOG[Lever(lever)]
    except ValueError:
        return None


def lever_words(lever: str) -> dict[str, Any]:
    """What the dashboard says about ``lever`` (a generic line for a name outside the
    catalog): title, line, saves, spends, headline, reported, spent_measured."""
    spec = _spec(lever)
    if spec is None:
        return {
            "title": lever.replace("_", " ").capitalize(),
            "line": "A lever reported by the engine (not in this build's catalog).",
            "saves": "",
            "spends": "",
            "headline": "sum",
            "reported": True,
            "spent_measured": True,
        }
    return {
        "title": spec.title,
        "line": spec.line,
        "saves": spec.saves,
        "spends": spec.spends,
        "headline": spec.headline,
        "reported": spec.reported,
        "spent_measured": spec.spent_measured,
    }


def _entry(lever: str, verb: str) -> dict[str, Any]:
    return {
        "lever": lever,
        "verb": verb,
        **lever_words(lever),
        "active": False,
        "samples": 0,
        "last_t": None,
        "saved": {},
        "spent": {},
    }


def ledger_by_verb(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group ledger rows (``storage.ledger_view``) by verb, then by lever.

    Every catalog lever gets an entry under each of its verbs; a row adds its ``saved``
    and ``spent`` amounts per unit (sum, mean, max) to its (verb, lever) entry and makes
    it ``active``. Verbs come in the catalog's order; a verb outside it is listed after.
    """
    levers: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in CATALOG.values():
        for verb in spec.verbs:
            levers[(verb.value, spec.lever.value)] = _entry(spec.lever.value, verb.value)
    for r in rows:
        key = (r["verb"], r["lever"])
        entry = levers.get(key)
        if entry is None:
            entry = levers[key] = _entry(r["lever"], r["verb"])
        entry["active"] = True
        entry["samples"] += r["samples"]
        entry["last_t"] = max(entry["last_t"] or 0.0, r["last_t"] or 0.0)
        for kind in ("saved", "spent"):
            unit = r[f"{kind}_unit"]
            if not unit:
                continue
            agg = entry[kind].setdefault(unit, {"sum": 0.0, "mean": 0.0, "max": 0.0, "n": 0})
            agg["sum"] += r[kind]
            agg["max"] = max(agg["max"], r[f"{kind}_max"])
            agg["n"] += r["samples"]
            agg["mean"] = agg["sum"] / max(agg["n"], 1)
    verbs = list(VERB_IDS) + sorted({v for v, _ in levers} - set(VERB_IDS))
    infos = {v.verb.value: v for v in VERBS}
    out = []
    for verb in verbs:
        info = infos.get(verb)
        entries = [e for (v, _), e in levers.items() if v == verb]
        entries.sort(key=lambda e: (not e["active"], e["title"], e["lever"]))
        out.append(
            {
                "verb": verb,
                "title": info.title if info else verb,
                "what": info.what if info else "",
                "bottleneck": info.bottleneck if info else "",
                "levers": entries,
            }
        )
    return out
