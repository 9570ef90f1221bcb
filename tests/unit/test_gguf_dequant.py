"""Q4_0 / Q4_1 / Q8_0 dequantized with torch (``weights_gguf.dequantize_data``'s fast
path) are bit for bit ``gguf.quants.dequantize``'s, for whole tensors and for the row
and block-column views a tensor-parallel rank takes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from houchu.model.weights.gguf import dequantize_data

TYPES = [
    gguf.GGMLQuantizationType.Q4_0,
    gguf.GGMLQuantizationType.Q4_1,
    gguf.GGMLQuantizationType.Q8_0,
]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_bit_for_bit_the_library(qtype):
    rng = np.random.default_rng(int(qtype))
    w = rng.normal(size=(48, 320)) * rng.uniform(1e-3, 4.0, size=(48, 1))
    w[3] = 0.0  # an all-zero row: zero scales
    w[5, :32] = 65000.0  # a scale at float16's edge
    q = gguf.quants.quantize(w.astype(np.float32), qtype)
    got = dequantize_data(q, qtype, (48, 320), "w")
    want = gguf.quants.dequantize(q, qtype).reshape(48, 320)
    assert got.dtype == np.float32 and got.shape == (48, 320) and got.flags.writeable
    np.testing.assert_array_equal(_bits(got), _bits(want))
    # a rank's views: rows 8..24, and block columns 2..6 (of 10 blocks of 32)
    block = q.shape[1] // 10
    for part, shape in ((q[8:24], (16, 320)), (q[:, 2 * block : 6 * block], (48, 128))):
        got = dequantize_data(part, qtype, shape, "w")
        want = gguf.quants.dequantize(np.ascontiguousarray(part), qtype).reshape(shape)
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_the_read_only_map_is_never_aliased(tmp_path):
    q = gguf.quants.quantize(np.ones((4, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
    q.setflags(write=False)
    got = dequantize_data(q, gguf.GGMLQuantizationType.Q8_0, (4, 64), "w")
    got[0, 0] = 2.0  # writeable, and its own memory
    assert not np.shares_memory(got, q)
