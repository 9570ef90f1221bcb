"""GGUF's quantized block types as houchu's int4 groups, without loss.

Every "legacy" and K-quant block type of ggml stores a weight as ``w = code · scale +
offset`` over groups of 16 or 32 consecutive input features, with an unsigned integer
code of 4 to 8 bits (ggml's ``dequantize_row_*`` in ``ggml-quants.c``; the same layouts
as ``gguf.quants``' ``dequantize_blocks``):

| type | block | group | code bits | scale | offset |
|---|---|---|---|---|---|
| Q4_0 | 32 | 32 | 4 | d | -8d |
| Q4_1 | 32 | 32 | 4 | d | m |
| Q4_K | 256 | 32 | 4 | d · sc_j (6-bit) | -dmin · m_j (6-bit) |
| Q5_0 | 32 | 32 | 5 | d | -16d |
| Q5_1 | 32 | 32 | 5 | d | m |
| Q5_K | 256 | 32 | 5 | d · sc_j | -dmin · m_j |
| Q6_K | 256 | 16 | 6 | d · sc_j (int8) | -32 d · sc_j |
| Q8_0 | 32 | 32 | 8 | d | -128d (code = q + 128) |
| Q2_K | 256 | 16 | 2 | d · sc_j (4-bit) | -dmin · m_j (4-bit) |
| Q3_K | 256 | 16 | 3 | d · sc_j (6-bit, -32..31) | -4 d · sc_j |

The scales and offsets are products of a float16 and a small integer, exact in float32.
A code of 2 to 4 bits is an ``Int4Weight`` code as it is. A wider code ``c = lo + 16 · hi`` is
split into two 4-bit *planes* (``lo = c & 15`` with the group's scale and offset, ``hi =
c >> 4`` with 16 × the scale and no offset): ``w = lo · s + o + hi · 16s``, so
``x · w = [x, x] · [lo | hi]``, one int4 product over twice the inputs
(``Int4Weight.planes``). Every int4 kernel of houchu (C++ GEMV on each ISA level, torch's
int4 matmuls, CUDA's tinygemm) then computes on the file's own values: 10 bits a weight
for a 5- or 6-bit type at group 32 (header included) against 32 for the float32 it was
dequantized to. The IQ types (codes into a non-uniform grid) and the ternary types have
no such form and are dequantized (``weights_gguf.dequantized_part``).
"""

from __future__ import annotations

import numpy as np
import torch

from houchu.model.quant.functions import Int4Weight

QK_K = 256  # elements of a K-quant super-block

#: GGUF types computed on as stored (``gguf_to_int4``): their code width in bits. The one
#: owner of which types houchu keeps; every other type is dequantized at load.
STORED_TYPES: dict[str, int] = {
    "Q4_0": 4,
    "Q4_1": 4,
    "Q4_K": 4,
    "Q5_0": 5,
    "Q5_1": 5,
    "Q5_K": 5,
    "Q6_K": 6,
    "Q8_0": 8,
    "Q2_K": 2,
    "Q3_K": 3,
}
#: bytes of one block, and elements in it
BLOCK_BYTES: dict[str, tuple[int, int]] = {
    "Q4_0": (18, 32),
    "Q4_1": (20, 32),
    "Q4_K": (144, QK_K),
    "Q5_0": (22, 32),
    "Q5_1": (24, 32),
    "Q5_K": (176, QK_K),
    "Q6_K": (210, QK_K),
    "Q8_0": (34, 32),
    "Q2_K": (84, QK_K),
    "Q3_K": (110, QK_K),
}


def _f16(b: np.ndarray) -> np.ndarray:
    """``[nb, 2]`` uint8 -> ``[nb, 1]`` float32 (a little-endian float16 each)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """Nibbles of ``[..., w]`` bytes -> ``[..., 2w]``: the low nibbles, then the high
    ones (ggml's order within a run of ``w`` bytes)."""
    return np.concatenate((qs & 0x0F, qs >> 4), axis=-1)


def _fifth_bit(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's ``[nb, 4]`` bytes of high bits -> ``[nb, 32]`` bits (element j: bit j
    of the little-endian uint32)."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of packed 6-bit scales and minimums -> two ``[nb, 8]`` uint8
    (ggml's ``get_scale_min_k4``)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), axis=-1)
    mn = np.concatenate((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), axis=-1)
    return sc, mn


def block_codes(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Decode GGUF blocks into codes, scales and offsets (module docstring's table).

    Args:
        raw: ``[nb, block bytes]`` uint8, one block a row.
        qtype: a key of ``STORED_TYPES``.
    Returns:
        ``(codes, scale, offset, group)``: codes ``[nb, block]`` uint8 (unsigned, below
        ``2 ** STORED_TYPES[qtype]``), scale and offset ``[nb, block / group]`` float32,
        with ``w = codes · scale + offset`` per group of ``group`` elements.
    Raises:
        ValueError: a type not in ``STORED_TYPES`` or rows of the wrong size.
    """
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"GGUF type {qtype} has no stored int4 form")
    nbytes, _ = BLOCK_BYTES[qtype]
    if raw.ndim != 2 or raw.shape[1] != nbytes:
        raise ValueError(f"{qtype} blocks are {nbytes} bytes, got rows of {raw.shape[1:]}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = raw.shape[0]
    if qtype in ("Q4_0", "Q4_1"):
        h = 2 if qtype == "Q4_0" else 4
        d = _f16(raw[:, 0:2])
        codes = _low_high(raw[:, h:])
        off = -8.0 * d if qtype == "Q4_0" else _f16(raw[:, 2:4])
        return codes, d, off.astype(np.float32), 32
    if qtype in ("Q5_0", "Q5_1"):
        h = 2 if qtype == "Q5_0" else 4
        d = _f16(raw[:, 0:2])
        codes = _low_high(raw[:, h + 4 :]) | (_fifth_bit(raw[:, h : h + 4]) << 4)
        off = -16.0 * d if qtype == "Q5_0" else _f16(raw[:, 2:4])
        return codes, d, off.astype(np.float32), 32
    if qtype == "Q8_0":
        d = _f16(raw[:, 0:2])
        codes = raw[:, 2:] ^ np.uint8(0x80)  # int8 q + 128, as uint8
        return codes, d, (-128.0 * d).astype(np.float32), 32
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
        sc, mn = k_scale_min(raw[:, 4:16])
        if qtype == "Q4_K":
            codes = _low_high(raw[:, 16:].reshape(nb, 4, 32)).reshape(nb, QK_K)
        else:
            qh = raw[:, 16:48].reshape(nb, 1, 32)  # bit 2j / 2j + 1: chunk j's halves
            ql = _low_high(raw[:, 48:].reshape(nb, 4, 32)).reshape(nb, 8, 32)
            bits = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # [nb, 8, 32]
            codes = (ql | (bits << 4)).reshape(nb, QK_K)
        scale = d * sc.astype(np.float32)
        return codes, scale, (-dmin * mn.astype(np.float32)), 32
    if qtype == "Q2_K":  # scales[16] (sc | m << 4), qs[64], d, dmin
        sc, qs = raw[:, 0:16], raw[:, 16:80].reshape(nb, 2, 1, 32)
        d, dmin = _f16(raw[:, 80:82]), _f16(raw[:, 82:84])
        shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
        codes = ((qs >> shifts) & 3).reshape(nb, QK_K)  # element 128h + 32s + l
        scale = d * (sc & 0x0F).astype(np.float32)
        return codes, scale, -dmin * (sc >> 4).astype(np.float32), 16
    if qtype == "Q3_K":  # hmask[32], qs[64], scales[12] (6-bit, -32), d
        hm, qs = raw[:, 0:32].reshape(nb, 1, 32), raw[:, 32:96].reshape(nb, 2, 1, 32)
        packed, d = raw[:, 96:108], _f16(raw[:, 108:110])
        low = np.concatenate((packed[:, :8] & 0x0F, packed[:, :8] >> 4), axis=-1)  # [nb, 16]
        high = (
            packed[:, 8:12].reshape(nb, 1, 4) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1)
        ) & 3
        sc = (low | (high.reshape(nb, 16) << 4)).astype(np.int8) - np.int8(32)
        shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
        ql = ((qs >> shifts) & 3).reshape(nb, QK_K)  # element 128h + 32s + l
        hbit = ((hm >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1).reshape(nb, QK_K)
        scale = d * sc.astype(np.float32)  # element 32i + l takes bit i of hmask[l]
        return ql | (hbit << 2), scale, -4.0 * scale, 16
    # Q6_K: ql[128], qh[64], scales[16] int8, d
    ql = raw[:, 0:128].reshape(nb, 2, 64)
    qh = raw[:, 128:192].reshape(nb, 2, 1, 32)
    sc = raw[:, 192:208].view(np.int8).astype(np.float32)  # [nb, 16]
    d = _f16(raw[:, 208:210])
    low = _low_high(ql.reshape(nb, 2, 2, 32))  # [nb, 2, 2, 64]: ql[0:32] | ql[32:64]
    # each half of 128: y[l + 32 i] takes the low nibble of ql[l], ql[l + 32], then the
    # high nibbles, with bits 2i..2i+1 of qh[l]
    low = low.reshape(nb, 2, 2, 2, 32).transpose(0, 1, 3, 2, 4).reshape(nb, 2, 4, 32)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    codes = (low | (high << 4)).reshape(nb, QK_K)
    scale = d * sc
    return codes, scale, -32.0 * scale, 16


def gguf_to_int4(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> Int4Weight:
    """A GGUF tensor of a ``STORED_TYPES`` type as an ``Int4Weight``, without loss.

    Args:
        data: the tensor's raw bytes, ``uint8`` ``[N, K / block · block bytes]`` (as
            ``gguf.ReaderTensor.data`` holds them), or any array of the same bytes.
        qtype: the GGUF type's name.
        shape: ``(N, K)`` of the dense weight.
    Returns:
        ``Int4Weight`` with the type's group size: one plane for a 2- to 4-bit type, two planes
        (``lo`` then ``hi``, module docstring) for a wider one. Its ``dequantize`` equals
        ``gguf.quants.dequantize`` up to float32 rounding of ``d · q + m``.
    Raises:
        ValueError: another type, or bytes that do not fit the shape.
    """
    n, k = shape
    if qtype not in STORED_TYPES:
        raise ValueError(f"GGUF type {qtype} has no stored int4 form")
    nbytes, block = BLOCK_BYTES[qtype]
    raw = np.ascontiguousarray(data, dtype=np.uint8)
    if k % block or raw.size != n * (k // block) * nbytes:
        raise ValueError(f"{qtype} data of {raw.size} bytes does not fit shape {shape}")
    codes, scale, offset, g = block_codes(raw.reshape(-1, nbytes), qtype)
    c = torch.from_numpy(codes.reshape(n, k))
    s = torch.from_numpy(np.ascontiguousarray(scale).reshape(n, k // g))
    o = torch.from_numpy(np.ascontiguousarray(offset).reshape(n, k // g))
    if STORED_TYPES[qtype] <= 4:
        return Int4Weight(c, s, o, g, kind=qtype)
    lo, hi = c & 0x0F, c >> 4
    return Int4Weight(
        torch.cat((lo, hi), dim=1),
        torch.cat((s, 16.0 * s), dim=1),
        torch.cat((o, torch.zeros_like(o)), dim=1),
        g,
        planes=2,
        kind=qtype,
    )


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """``[nb]`` float -> ``[nb, 2]`` uint8 (little-endian float16)."""
    return np.ascontiguousarray(v.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def _k_fit(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's asymmetric fit of ``[nb, 8, 32]`` values by min/max: codes
    ``[nb, 8, 32]`` uint8 in ``0..levels``, and the super-block's packed header bytes
    ``[nb, 16]`` (d, dmin, 12 bytes of 6-bit scales and minimums)."""
    lo = np.minimum(x.min(axis=-1), 0.0)  # [nb, 8]
    scale, mins = (x.max(axis=-1) - lo) / levels, -lo
    d = (scale.max(axis=-1) / 63).astype(np.float16).astype(np.float32)  # [nb]
    dmin = (mins.max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63)
        mn = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 63)
        s = (d[:, None] * sc)[..., None]  # [nb, 8, 1]
        m = (dmin[:, None] * mn)[..., None]
        codes = np.where(s > 0, np.rint((x + m) / s), 0).clip(0, levels).astype(np.uint8)
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    packed = np.concatenate(  # the inverse of ``k_scale_min``
        (
            (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4),
        ),
        axis=-1,
    )
    return codes, np.concatenate((_f16_bytes(d), _f16_bytes(dmin), packed), axis=-1)


def quantize_blocks(x: np.ndarray, qtype: str) -> np.ndarray:
    """Quantize float weights to GGUF blocks of ``qtype``, as a file would hold them.

    The K-quants (which ``gguf.quants`` cannot quantize) are fitted by min/max per
    sub-block, then their scales to 6 (Q4_K/Q5_K) or 8 (Q6_K) bits: a plain fit, not
    llama.cpp's searched one, in ggml's exact block layouts (``block_codes`` reads them
    back); the other types go through ``gguf.quants.quantize``.

    Args:
        x: ``[rows, K]`` float32, ``K`` a multiple of the type's block.
        qtype: a GGUF type name.
    Returns:
        ``[rows, K / block · block bytes]`` uint8.
    Raises:
        ValueError: ``K`` not a multiple of the block.
    """
    import gguf

    if qtype not in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        return gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype])
    rows, k = x.shape
    if k % QK_K:
        raise ValueError(f"{qtype} needs rows of a multiple of {QK_K} values, got {k}")
    nb = rows * k // QK_K
    xb = np.asarray(x, dtype=np.float32).reshape(nb, QK_K)
    if qtype == "Q4_K":
        codes, head = _k_fit(xb.reshape(nb, 8, 32), 15)
        qs = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(nb, 128)
        return np.concatenate((head, qs), axis=-1).reshape(rows, -1)
    if qtype == "Q5_K":
        codes, head = _k_fit(xb.reshape(nb, 8, 32), 31)
        low = codes & 0x0F
        qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(nb, 128)
        bits = (codes >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        qh = np.bitwise_or.reduce(bits, axis=1)  # [nb, 32]: bit j from sub-block j
        return np.concatenate((head, qh, qs), axis=-1).reshape(rows, -1)
    if qtype in ("Q2_K", "Q3_K"):
        return _quantize_low_k(xb.reshape(nb, 16, 16), qtype).reshape(rows, -1)
    # Q6_K: 16 groups of 16, symmetric codes -32..31, int8 scales times d
    g = xb.reshape(nb, 16, 16)
    amax = np.abs(g).max(axis=-1)  # [nb, 16]
    d = (amax.max(axis=-1) / 32 / 127).astype(np.float16).astype(np.float32)  # [nb]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(amax / 32 / d[:, None]), 0).clip(-128, 127)
        s = (d[:, None] * sc)[..., None]
        q = np.where(s > 0, np.rint(g / s), 0).clip(-32, 31)
    c = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # [half, quarter, l]
    ql = np.concatenate(
        (
            c[:, :, 0] & 0x0F | (c[:, :, 2] & 0x0F) << 4,
            c[:, :, 1] & 0x0F | (c[:, :, 3] & 0x0F) << 4,
        ),
        axis=-1,
    ).reshape(nb, 128)
    qh = c[:, :, 0] >> 4 | (c[:, :, 1] >> 4) << 2 | (c[:, :, 2] >> 4) << 4 | (c[:, :, 3] >> 4) << 6
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate((ql, qh.reshape(nb, 64), scales, _f16_bytes(d)), axis=-1).reshape(
        rows, -1
    )


def _pack_2bit(codes: np.ndarray) -> np.ndarray:
    """``[nb, 256]`` codes (their low 2 bits) -> ``[nb, 64]`` bytes: element 128h + 32s +
    l in bits 2s..2s+1 of byte 32h + l (Q2_K's and Q3_K's ``qs``)."""
    c = (codes & 3).reshape(-1, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return np.bitwise_or.reduce(c, axis=2).reshape(-1, 64)


def _quantize_low_k(g: np.ndarray, qtype: str) -> np.ndarray:
    """Q2_K (asymmetric, 4-bit scales and minimums) or Q3_K (symmetric, 6-bit signed
    scales) blocks of ``[nb, 16, 16]`` values, fitted by min/max."""
    nb = g.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if qtype == "Q2_K":
            lo = np.minimum(g.min(axis=-1), 0.0)
            scale, mins = (g.max(axis=-1) - lo) / 3, -lo  # [nb, 16]
            d = (scale.max(axis=-1) / 15).astype(np.float16).astype(np.float32)
            dmin = (mins.max(axis=-1) / 15).astype(np.float16).astype(np.float32)
            sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 15)
            mn = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 15)
            s, m = (d[:, None] * sc)[..., None], (dmin[:, None] * mn)[..., None]
            codes = np.where(s > 0, np.rint((g + m) / s), 0).clip(0, 3).astype(np.uint8)
            head = (sc.astype(np.uint8) | (mn.astype(np.uint8) << 4)).reshape(nb, 16)
            qs = _pack_2bit(codes.reshape(nb, QK_K))
            return np.concatenate((head, qs, _f16_bytes(d), _f16_bytes(dmin)), axis=-1)
        scale = np.abs(g).max(axis=-1) / 4  # codes -4..3
        d = (scale.max(axis=-1) / 31).astype(np.float16).astype(np.float32)
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(-32, 31)
        s = (d[:, None] * sc)[..., None]
        q = np.where(s > 0, np.rint(g / s), 0).clip(-4, 3)
    codes = (q + 4).astype(np.uint8).reshape(nb, QK_K)
    hbits = (codes >> 2).reshape(nb, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    hmask = np.bitwise_or.reduce(hbits, axis=1)  # [nb, 32]: bit i of element 32i + l
    u = (sc + 32).astype(np.uint8)  # [nb, 16] 6-bit
    low = (u[:, :8] & 0x0F) | ((u[:, 8:] & 0x0F) << 4)
    top = (u >> 4).reshape(nb, 4, 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1)
    high = np.bitwise_or.reduce(top, axis=1)  # [nb, 4]: j = 4i + k in bits 2i of byte k
    return np.concatenate((hmask, _pack_2bit(codes), low, high, _f16_bytes(d)), axis=-1)
