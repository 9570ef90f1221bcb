"""Hypothesis strategies of frames a peer must refuse: garbage, truncated and mistyped msgpack."""

from __future__ import annotations

import msgspec
from hypothesis import strategies as st

from houchu.transport.messages import AbortRequest

GOOD = msgspec.msgpack.encode(AbortRequest("ok"))


int64 = st.integers(-(2**63), 2**63 - 1)


scalars = st.none() | st.booleans() | int64 | st.floats() | st.text(max_size=5)


fields = st.dictionaries(st.text(max_size=8), scalars, max_size=4)


garbage = st.one_of(
    st.binary(max_size=300),
    st.integers(0, len(GOOD) - 1).map(lambda n: GOOD[:n]),  # truncated msgpack
    fields.map(lambda d: {**d, "type": "NoSuchMessage"}).map(msgspec.msgpack.encode),
    st.tuples(st.sampled_from(["AbortRequest", "StepResult", "TokenizedRequest"]), fields)
    .map(lambda t: {**t[1], "type": t[0]})
    .map(msgspec.msgpack.encode),  # a known tag with wrong or missing fields
    st.recursive(scalars, st.lists).map(msgspec.msgpack.encode),  # wrong type
    st.just(b"\x91" * 5000),  # deep nesting
)
