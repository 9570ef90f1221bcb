"""Rewrites of a JSON schema before the grammar engine (llguidance) compiles it.

- ``no_value_nots``: a ``not`` of a schema every value matches becomes ``false``
  (llguidance does not implement ``not``);
- ``closed_objects``: vLLM's ``disable_additional_properties`` (an object schema with
  ``properties`` or ``patternProperties`` that does not say ``additionalProperties``
  gets ``additionalProperties: false``).

Both walk only the keywords whose values are schemas, so a property named ``not`` or
``properties`` is a name, not a keyword. Both recurse per level: they are given only a
schema whose depth ``houchu.api.structured.request.json_schema_grammar`` checked first (at most
``houchu.api.requests.json_depth.MAX_JSON_DEPTH`` levels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Keywords that describe a schema without constraining its values.
_ANNOTATIONS = frozenset(
    {"title", "description", "$comment", "default", "examples", "deprecated"}
    | {"readOnly", "writeOnly", "$id", "$schema"}
)
#: Keywords whose value is a schema (``items`` may be a list of them), a list of
#: schemas, or an object of named schemas.
_SUBSCHEMA = frozenset(
    {"not", "items", "additionalProperties", "additionalItems", "contains", "if", "then"}
    | {"else", "propertyNames", "unevaluatedItems", "unevaluatedProperties"}
)
_SUBSCHEMAS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
#: Keywords whose value is an object of named schemas (a name is no keyword).
NAMED_SUBSCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def no_value_nots(schema: Any) -> Any:
    """``schema`` with every ``{"not": S}`` whose ``S`` every value matches (``{}``,
    ``true``, or only annotations) made to match no value (``allOf: [false]``), as
    JSON Schema defines it. llguidance does not implement ``not`` (it ignores it, or
    refuses it with ``strict``), so ``{"not": {}}`` would let any JSON through; written
    as ``false``, llguidance finds where it leaves no value (a 400 when the whole
    schema matches nothing, ``describe``) and leaves out what it cannot be (an optional
    property). Only keywords holding schemas are walked (a property named ``not`` is
    left alone)."""
    if not isinstance(schema, dict):
        return schema
    out = _subschemas_mapped(schema, no_value_nots)
    negated, all_of = out.get("not"), out.get("allOf", [])
    matches_all = negated is True or (isinstance(negated, dict) and set(negated) <= _ANNOTATIONS)
    if matches_all and isinstance(all_of, list):
        del out["not"]
        out["allOf"] = [*all_of, False]
    return out


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` in every object schema (one with
    ``properties`` or ``patternProperties``, as vLLM's guidance backend picks them) that
    does not say ``additionalProperties``: vLLM's ``disable_additional_properties``, so
    the output holds only the properties the schema names. Subschemas are walked as in
    ``no_value_nots``; the input is not changed."""
    if not isinstance(schema, dict):
        return schema
    out = _subschemas_mapped(schema, closed_objects)
    if ("properties" in out or "patternProperties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _subschemas_mapped(schema: dict[str, Any], f: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of ``schema`` with ``f`` applied to each of its subschemas (the values of
    ``_SUBSCHEMA``, ``_SUBSCHEMAS`` and ``NAMED_SUBSCHEMAS`` keywords), every other
    value as it is."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA:
            out[key] = [f(v) for v in value] if isinstance(value, list) else f(value)
        elif key in _SUBSCHEMAS and isinstance(value, list):
            out[key] = [f(v) for v in value]
        elif key in NAMED_SUBSCHEMAS and isinstance(value, dict):
            out[key] = {name: f(v) for name, v in value.items()}
        else:
            out[key] = value
    return out
