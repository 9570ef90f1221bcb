"""Weight and activation quantization math (pure tensor functions, no modules).

Formats:

- **int4, asymmetric, per group**: each row of a weight ``[N, K]`` is cut into groups
  of ``G`` consecutive input features; a group's values are ``w ≈ q · scale + offset``
  with ``q ∈ 0..15``, each value rounded to its nearest level. A float weight's scale and
  offset are searched per group to minimise the squared rounding error (``quantize_int4``
  "mse", ``houchu.model.int4_mse``: llama.cpp's K-quant search, 11% lower RMSE than
  min/max on trained weights), or set from the group's range (min/max round-to-nearest,
  "RTN": ``scale = (max - min) / 15``, ``offset = min``; method "minmax").
  llama.cpp's Q4_0 (``w = (q - 8) · d``) and Q4_1 (``w = q · d + m``)
  blocks of 32 are the same form (offset ``-8d`` and ``m``), so they convert losslessly
  (ggml's ``block_q4_0`` / ``block_q4_1`` layouts: an fp16 ``d`` (and ``m``), then 16 bytes
  whose low nibbles hold elements 0..15 and high nibbles elements 16..31).
- **int8, symmetric, per output channel**: ``w ≈ q · scale[n]``, ``q ∈ -127..127``,
  ``scale = absmax / 127`` (as torch's ``_weight_int8pack_mm`` expects).
- **int8 / fp8 activations, symmetric, per token** (dynamic, computed every step), for
  W8A8 matmuls (Dettmers et al. 2022 "LLM.int8()" / Xiao et al. 2023 "SmoothQuant" use
  the same per-token form).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from houchu.model.int4_mse import fit_int4_groups, rtn_int4_groups

INT4_GROUP_SIZES = (32, 64, 128)
FP8_MAX = 448.0  # largest finite float8_e4m3fn
QUANT_MODES = ("none", "int4", "int8", "w8a8")
#: What ``--quantization`` accepts: the modes, and "auto" (``resolve_quant_mode``).
QUANT_CHOICES = ("auto", *QUANT_MODES)
#: int4 layers' activations: measured per batch bucket (auto), exact (float) or int8
INT4_ACTIVATIONS = ("auto", "float", "int8")
#: how ``quantize_int4`` picks a group's scale and offset
INT4_METHODS = ("mse", "minmax")
#: how a float weight becomes int4 (``QuantSpec.int4_method``): ``quantize_int4``'s
#: methods, or GPTQ over calibration text (``houchu.model.gptq``)
INT4_WEIGHT_METHODS = (*INT4_METHODS, "gptq")


def resolve_quant_mode(mode: str, model_path: str | Path) -> str:
    """The quantization mode to run ``model_path`` with.

    "auto" keeps a GGUF file's 4-bit projections 4-bit: "int4" when its attention and MLP
    projections are Q4_0/Q4_1 (converted losslessly, as llama.cpp computes on them), else
    "none" (dense, the exact path). Any other mode is returned as given.

    Raises:
        ValueError: ``mode`` is not "auto" or one of ``QUANT_MODES``.
    """
    if mode != "auto":
        if mode not in QUANT_MODES:
            raise ValueError(f"quantization must be one of {QUANT_CHOICES}, got {mode!r}")
        return mode
    p = Path(model_path)
    if not (p.is_file() and p.suffix == ".gguf"):
        return "none"
    from houchu.model.gguf_index import open_gguf_index

    reader = open_gguf_index(p)
    proj = [t.tensor_type.name for t in reader.tensors if t.name.endswith("attn_q.weight")]
    return "int4" if proj and all(t in ("Q4_0", "Q4_1") for t in proj) else "none"


@dataclass(frozen=True)
class QuantSpec:
    """How a model's matmul weights are stored and multiplied.

    Attributes:
        mode: "none" (dense, the exact path), "int4" / "int8" (weight-only), "w8a8"
            (int8 weights and activations).
        group_size: int4 input features per scale/zero group (32, 64 or 128). A GGUF
            file's Q4_0/Q4_1 tensors keep their own groups of 32 (converted losslessly).
        int4_activations: what int4 layers multiply on houchu's CPU kernels: "float"
            (the activations as they are, exact products), "int8" (quantized per group
            to int8, integer dot products: W4A8, as llama.cpp's Q4 x Q8 kernels), or
            "auto" (whichever the startup measurement finds faster, per batch bucket).
        int4_method: how a float weight becomes int4: "mse" (each group's scale and
            offset searched to minimise its rounding error), "minmax" (round to the
            nearest of 16 levels over the group's range) or "gptq" (GPTQ over
            calibration text, ``houchu.model.gptq``). A GGUF file's Q4 tensors are kept
            as they are whatever the method.
        calibration: GPTQ's calibration text file (None: ``houchu.model.calibration``'s
            default text).

    Raises:
        ValueError: unknown mode or group size.
    """

    mode: str = "none"
    group_size: int = 32
    int4_activations: str = "float"
    int4_method: str = "mse"
    calibration: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise ValueError(f"quantization must be one of {QUANT_MODES}, got {self.mode!r}")
        if self.group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"int4 group size must be one of {INT4_GROUP_SIZES}, got {self.group_size}"
            )
        if self.int4_activations not in INT4_ACTIVATIONS:
            raise ValueError(
                f"int4 activations must be one of {INT4_ACTIVATIONS}, got {self.int4_activations!r}"
            )
        if self.int4_method not in INT4_WEIGHT_METHODS:
            raise ValueError(
                f"int4 method must be one of {INT4_WEIGHT_METHODS}, got {self.int4_method!r}"
            )

    @property
    def keeps_gguf_q4(self) -> bool:
        """Whether GGUF Q4_0/Q4_1 tensors are kept as int4 rather than dequantized."""
        return self.mode == "int4"

    @property
    def gptq(self) -> bool:
        """Whether float weights become int4 by GPTQ (over calibration text)."""
        return self.mode == "int4" and self.int4_method == "gptq"

    def label(self) -> str:
        """Short description, e.g. "int4-g32", "int4-g32-gptq" or "none"."""
        if self.mode != "int4":
            return self.mode
        return f"int4-g{self.group_size}" + ("-gptq" if self.gptq else "")


@dataclass
class Int4Weight:
    """A weight matrix quantized to int4 in groups along the input dimension.

    Attributes:
        q: ``[N, K]`` uint8, values 0..15 (one per byte; packed only by the layers).
        scale: ``[N, K // group_size]`` float32.
        offset: ``[N, K // group_size]`` float32; ``w ≈ q * scale + offset``.
        group_size: input features per group.
    """

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int

    @property
    def shape(self) -> torch.Size:
        """``(N, K)``, like the dense weight."""
        return self.q.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense ``[N, K]`` weight in ``dtype`` (computed in float32)."""
        n, k = self.q.shape
        g = self.q.view(n, k // self.group_size, self.group_size).float()
        w = g * self.scale[..., None] + self.offset[..., None]
        return w.view(n, k).to(dtype)

    def permute_rows(self, fn) -> Int4Weight:  # noqa: ANN001 (a row-permuting function)
        """Apply a row permutation ``fn(tensor) -> tensor`` (e.g. ``unpermute_qk``) to the
        codes and the per-row group parameters alike."""
        return Int4Weight(fn(self.q), fn(self.scale), fn(self.offset), self.group_size)

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """Stack several weights' rows (fused q/k/v or gate/up projections).

        Raises:
            ValueError: group sizes or input widths differ.
        """
        if len({p.group_size for p in parts}) != 1 or len({p.q.shape[1] for p in parts}) != 1:
            raise ValueError("int4 weights fused together need one group size and input width")
        return Int4Weight(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.offset for p in parts]),
            parts[0].group_size,
        )


class QuantShapeError(ValueError):
    """A weight's shape does not fit the quantization asked for (an int4 group size that
    does not divide its input width); the message says what to use instead."""


def check_group_size(k: int, group_size: int) -> None:
    """Raise ``QuantShapeError`` unless ``group_size`` is 32/64/128 and divides ``k``."""
    if group_size not in INT4_GROUP_SIZES:
        raise QuantShapeError(
            f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}"
        )
    if k % group_size != 0:
        fits = [g for g in INT4_GROUP_SIZES if k % g == 0]
        hint = (
            f"use --quant-group-size {fits[0]}"
            if fits
            else f"no int4 group size {INT4_GROUP_SIZES} divides it: use --quantization int8"
        )
        raise QuantShapeError(
            f"int4 group size {group_size} does not divide the input width {k}; {hint}"
        )


def quantize_int4(w: torch.Tensor, group_size: int, method: str = "mse") -> Int4Weight:
    """Asymmetric int4 quantization per group (module docstring).

    Args:
        w: ``[N, K]`` float weight (any float dtype).
        group_size: 32, 64 or 128; must divide K.
        method: "mse" (each group's scale and offset searched to minimise its squared
            rounding error, ``houchu.model.int4_mse``; never above min/max's) or "minmax"
            (``scale = (max - min) / 15``, ``offset = min``).
    Returns:
        ``Int4Weight``.
    Raises:
        ValueError: bad group size or method.
    """
    n, k = w.shape
    check_group_size(k, group_size)
    if method not in INT4_METHODS:
        raise ValueError(f"int4 method must be one of {INT4_METHODS}, got {method!r}")
    g = w.float().reshape(n * (k // group_size), group_size)
    q, scale, offset = (fit_int4_groups if method == "mse" else rtn_int4_groups)(g)
    shape = (n, k // group_size)
    return Int4Weight(q.reshape(n, k), scale.reshape(shape), offset.reshape(shape), group_size)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 quantization.

    Args:
        w: ``[N, K]`` float weight.
    Returns:
        ``(q, scale)``: q ``[N, K]`` int8 in -127..127, scale ``[N]`` float32 with
        ``w ≈ q * scale[:, None]``.
    """
    wf = w.float()
    scale = (wf.abs().amax(-1) / 127.0).clamp(min=1e-10)  # [N]
    q = (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row float8_e4m3fn quantization (weights per output channel, activations per
    token).

    Args:
        w: ``[R, K]`` float.
    Returns:
        ``(q, scale)``: q ``[R, K]`` float8_e4m3fn, scale ``[R]`` float32, ``w ≈ q * scale``.
    """
    wf = w.float()
    scale = (wf.abs().amax(-1) / FP8_MAX).clamp(min=1e-12)  # [R]
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric per-token int8 quantization of activations.

    Args:
        x: ``[M, K]`` float activations.
    Returns:
        ``(q, scale)``: q ``[M, K]`` int8, scale ``[M, 1]`` float32, ``x ≈ q * scale``.
    """
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / 127.0).clamp(min=1e-10)  # [M, 1]
    q = (xf / scale).round().clamp(-127, 127).to(torch.int8)
    return q, scale


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Two int4 codes per byte. q: ``[N, K]`` uint8 (0..15, K even) -> ``[N, K/2]`` uint8
    (low nibble = even column, high nibble = odd column)."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_nibbles``: ``[N, K/2]`` uint8 -> ``[N, K]`` uint8."""
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1)


def gguf_q4_to_int4(data: np.ndarray, qtype_name: str, shape: tuple[int, int]) -> Int4Weight:
    """Convert a GGUF Q4_0 / Q4_1 tensor to ``Int4Weight`` without loss.

    Args:
        data: the tensor's raw bytes, ``uint8`` ``[N, K / 32 * block_bytes]`` (as
            ``gguf.ReaderTensor.data`` holds them; 18-byte Q4_0 or 20-byte Q4_1 blocks).
        qtype_name: "Q4_0" or "Q4_1".
        shape: ``(N, K)`` of the dense weight.
    Returns:
        ``Int4Weight`` with group size 32.
    Raises:
        ValueError: another type, or bytes that do not match the shape.
    """
    n, k = shape
    header = {"Q4_0": 2, "Q4_1": 4}.get(qtype_name)
    if header is None:
        raise ValueError(f"not a Q4_0/Q4_1 tensor: {qtype_name}")
    block = header + 16
    raw = np.ascontiguousarray(data, dtype=np.uint8)
    if raw.size != n * (k // 32) * block or k % 32 != 0:
        raise ValueError(f"{qtype_name} data of {raw.size} bytes does not fit shape {shape}")
    b = torch.from_numpy(raw.reshape(n, k // 32, block).copy())  # [N, K/32, block]
    d, m, q = q4_block_parts(b, header)  # [N, K/32, 1] x2 (m None for Q4_0), [N, K/32, 32]
    d = d.squeeze(-1)  # [N, K/32]
    offset = -8.0 * d if m is None else m.squeeze(-1)
    return Int4Weight(q.reshape(n, k), d, offset, 32)


def q4_block_parts(
    b: torch.Tensor, header: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The parts of GGUF Q4_0 (``header`` 2) / Q4_1 (``header`` 4) blocks of 32 weights.

    Args:
        b: ``[..., header + 16]`` uint8 blocks: a float16 scale d, for Q4_1 a float16
            minimum m, then 16 bytes of codes.
    Returns:
        ``(d, m, q)``: ``[..., 1]`` float32 scales, ``[..., 1]`` float32 minimums (None
        for Q4_0) and ``[..., 32]`` uint8 codes (element j in the low nibble of byte j,
        element j + 16 in its high nibble). Q4_0's weight is ``d * (q - 8)``, Q4_1's
        ``d * q + m``.
    """
    d = b[..., 0:2].contiguous().view(torch.float16).float()
    m = b[..., 2:4].contiguous().view(torch.float16).float() if header == 4 else None
    qs = b[..., header:]
    return d, m, torch.cat((qs & 0xF, qs >> 4), dim=-1)
