"""The ``houchu bench --structured json-schema`` schema never lets a request finish before
its output length (the issue it fixes: the array closed after ``[]``, 3 tokens)."""

from __future__ import annotations

import jsonschema
import pytest

from houchu.bench.cli import BENCH_MIN_RECORDS, BENCH_SCHEMA, structured_fields

RECORD = {"id": 1, "name": "a", "active": True, "tags": ["a"]}


@pytest.mark.parametrize("n", [0, 1, 100, BENCH_MIN_RECORDS - 1])
def test_short_arrays_do_not_validate(n: int) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([RECORD] * n, BENCH_SCHEMA)


def test_the_minimum_validates_and_is_sent() -> None:
    jsonschema.validate([RECORD] * BENCH_MIN_RECORDS, BENCH_SCHEMA)
    spec = structured_fields("json-schema")["response_format"]["json_schema"]
    assert spec["schema"]["minItems"] == BENCH_MIN_RECORDS
