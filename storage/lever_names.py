"""Lever names and units recorded before the lever catalog (``houchu.transport.levers``),
mapped to the catalog's: migration 0004 rewrites the stored history with them once, and
readers of older files (the lever sweep's JSON records) map with ``current_lever``.

Two things changed when the catalog took over:

- weight quantization reported one name per label (``weight_quant_int4-g32``,
  ``weight_quant_int4-g128-gptq``); the catalog has one lever per ``--quantization``
  mode (``weight_quant_int4``);
- levers whose cost no counter measures reported it as 0 in a unit (weight-only int4
  spending "0 B"); they now report ``Unit.NONE`` (""), which the dashboard shows as
  "not measured". ``UNMEASURED_SPENT`` lists the old (lever, spent unit) pairs.
"""

from __future__ import annotations

from houchu.transport.levers import Lever

#: Recorded name prefix -> the catalog lever (the weight quantization labels).
_RENAMED_PREFIXES: tuple[tuple[str, Lever], ...] = (("weight_quant_int4", Lever.WEIGHT_QUANT_INT4),)

#: Old (lever name prefix, spent unit) pairs whose spent amount was always 0: their cost
#: is not measured, and is stored as spent unit "" now.
UNMEASURED_SPENT: tuple[tuple[str, str], ...] = (
    ("weight_quant_", "bytes"),
    ("flash_attention", "bytes"),
    ("half_precision_", "bytes"),
    ("mla", "tokens"),
    ("mla", "requests"),
    ("mla", "bytes"),
    ("sliding_window_attention", "bytes"),
    ("continuous_batching", "seconds"),
)


def current_lever(name: str) -> str:
    """The catalog's name for a lever name recorded before it (itself when unchanged)."""
    for prefix, lever in _RENAMED_PREFIXES:
        if name.startswith(prefix):
            return lever.value
    return name


def current_spent_unit(name: str, spent_unit: str) -> str:
    """The spent unit a sample of lever ``name`` (as recorded) carries now: "" where the
    old unit stood for a cost no counter measures."""
    for prefix, unit in UNMEASURED_SPENT:
        if name.startswith(prefix) and spent_unit == unit:
            return ""
    return spent_unit
