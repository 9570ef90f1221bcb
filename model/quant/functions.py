"""Weight and activation quantization math (pure tensor functions, no modules).

Formats:

- **int4, asymmetric, per group**: each row of a weight ``[N, K]`` is cut into groups
  of ``G`` consecutive input features; a group's values are ``w ≈ q · scale + offset``
  with ``q ∈ 0..15``, each value rounded to its nearest level. A float weight's scale and
  offset are searched per group to minimise the squared rounding error (``quantize_int4``
  "mse", ``houchu.model.quant.int4_mse``: llama.cpp's K-quant search, 11% lower RMSE than
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

import dataclasses
from dataclasses import dataclass

import torch

from houchu.model.quant.int4_mse import fit_int4_groups, rtn_int4_groups

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
#: methods, or GPTQ over calibration text (``houchu.model.quant.gptq``)
INT4_WEIGHT_METHODS = (*INT4_METHODS, "gptq")


@dataclass(frozen=True)
class QuantSpec:
    """How a model's matmul weights are stored and multiplied.

    Attributes:
        mode: "none" (dense, the exact path), "int4" / "int8" (weight-only), "w8a8"
            (int8 weights and activations).
        group_size: int4 input features per scale/zero group (32, 64 or 128). A GGUF
            file's stored tensors (``gguf_blocks.STORED_TYPES``) keep their own groups
            (converted losslessly).
        int4_activations: what int4 layers multiply on houchu's CPU kernels: "float"
            (the activations as they are, exact products), "int8" (quantized per group
            to int8, integer dot products: W4A8, as llama.cpp's Q4 x Q8 kernels), or
            "auto" (whichever the startup measurement finds faster, per batch bucket).
        int4_method: how a float weight becomes int4: "mse" (each group's scale and
            offset searched to minimise its rounding error), "minmax" (round to the
            nearest of 16 levels over the group's range) or "gptq" (GPTQ over
            calibration text, ``houchu.model.quant.gptq``). A GGUF file's Q4 tensors are kept
            as they are whatever the method.
        calibration: GPTQ's calibration text file (None: ``houchu.model.quant.calibration``'s
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
        """Whether GGUF tensors of ``gguf_blocks.STORED_TYPES`` are kept as stored (int4
        planes) rather than dequantized."""
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

    A weight of wider codes (a GGUF Q5/Q6/Q8 tensor, ``houchu.model.gguf.blocks``) is
    held as ``planes`` int4 planes side by side along the input dimension: plane ``p``
    covers stored columns ``[p·K, (p+1)·K)`` and the dense weight is the sum of the
    planes' dequantized values, so ``x @ w.T == [x, ..., x] @ stored.T``.

    Attributes:
        q: ``[N, planes · K]`` uint8, values 0..15 (one per byte; packed only by the layers).
        scale: ``[N, planes · K // group_size]`` float32.
        offset: ``[N, planes · K // group_size]`` float32; ``w ≈ q * scale + offset``.
        group_size: input features per group.
        planes: 1, or 2 for codes of 5 to 8 bits (low nibble, then high nibble).
        kind: the stored format it came from ("Q4_K", ...; "" for houchu's own
            quantization), for start-up lines.
    """

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int
    planes: int = 1
    kind: str = ""

    @property
    def shape(self) -> torch.Size:
        """``(N, K)``, like the dense weight."""
        n, kp = self.q.shape
        return torch.Size((n, kp // self.planes))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense ``[N, K]`` weight in ``dtype`` (computed in float32)."""
        n, kp = self.q.shape
        g = self.q.view(n, kp // self.group_size, self.group_size).float()
        w = (g * self.scale[..., None] + self.offset[..., None]).view(n, self.planes, -1)
        return w.sum(dim=1).to(dtype) if self.planes > 1 else w.view(n, kp).to(dtype)

    def permute_rows(self, fn) -> Int4Weight:  # noqa: ANN001 (a row-permuting function)
        """Apply a row permutation ``fn(tensor) -> tensor`` (e.g. ``unpermute_qk``) to the
        codes and the per-row group parameters alike."""
        return dataclasses.replace(self, q=fn(self.q), scale=fn(self.scale), offset=fn(self.offset))

    def rows(self, s: slice) -> Int4Weight:
        """The output rows ``s`` (``[n, K]``)."""
        return dataclasses.replace(self, q=self.q[s], scale=self.scale[s], offset=self.offset[s])

    def columns(self, a: int, b: int) -> Int4Weight:
        """The input columns ``[a, b)`` of every plane; ``a`` and ``b`` are multiples of
        the group size.

        Raises:
            ValueError: a cut inside a group.
        """
        g, k = self.group_size, self.shape[1]
        if a % g or b % g:
            raise ValueError(f"int4 columns {a}:{b} cut a group of {g}")
        q = torch.cat([self.q[:, p * k + a : p * k + b] for p in range(self.planes)], dim=1)
        sp = [slice((p * k + a) // g, (p * k + b) // g) for p in range(self.planes)]
        scale = torch.cat([self.scale[:, s] for s in sp], dim=1)
        offset = torch.cat([self.offset[:, s] for s in sp], dim=1)
        return dataclasses.replace(self, q=q, scale=scale, offset=offset)

    def with_planes(self, planes: int) -> Int4Weight:
        """The same weight over ``planes`` planes (>= its own): zero planes appended
        (codes, scales and offsets 0), so it fuses with wider weights."""
        if planes == self.planes:
            return self
        n, k = self.shape
        extra = planes - self.planes
        zq = torch.zeros(n, extra * k, dtype=self.q.dtype)
        zs = torch.zeros(n, extra * k // self.group_size, dtype=self.scale.dtype)
        return dataclasses.replace(
            self,
            q=torch.cat((self.q, zq), dim=1),
            scale=torch.cat((self.scale, zs), dim=1),
            offset=torch.cat((self.offset, zs), dim=1),
            planes=planes,
        )

    def regroup(self, group_size: int) -> Int4Weight:
        """The same weight in groups of ``group_size`` (a divisor of its own): each group's
        scale and offset repeated over its sub-groups, without loss.

        Raises:
            ValueError: ``group_size`` does not divide the weight's group size.
        """
        if group_size == self.group_size:
            return self
        if self.group_size % group_size:
            raise ValueError(f"groups of {group_size} do not divide groups of {self.group_size}")
        r = self.group_size // group_size
        return dataclasses.replace(
            self,
            scale=self.scale.repeat_interleave(r, dim=1),
            offset=self.offset.repeat_interleave(r, dim=1),
            group_size=group_size,
        )

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """Stack several weights' rows (fused q/k/v or gate/up projections), without
        loss: a part of fewer planes gets zero planes (``with_planes``), and parts of
        different group sizes take the smallest (``regroup``: a Q4_K's groups of 32 beside
        a Q6_K's of 16).

        Raises:
            ValueError: input widths differ, or a group size that does not divide another.
        """
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("int4 weights fused together need one input width")
        group = min(p.group_size for p in parts)
        planes = max(p.planes for p in parts)
        parts = [p.regroup(group).with_planes(planes) for p in parts]
        kinds = sorted({p.kind for p in parts})
        return Int4Weight(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.offset for p in parts]),
            parts[0].group_size,
            planes,
            "+".join(k for k in kinds if k),
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
            rounding error, ``houchu.model.quant.int4_mse``; never above min/max's) or "minmax"
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
