"""Quantized linear layers: weight-only int4 and int8 (move less); W8A8 (compute less) is
``houchu.model.linear.w8a8``, and ``houchu.model.linear.factory.make_linear`` picks among
them.

Kernels: on the CPU, where houchu's C++ kernels are loaded (``houchu.cpu.kernels``,
``gemv.cpp``), decode-sized row counts use its AVX-512 int4 / int8 GEMV
(``cpu_kernels.ops().int4_gemv`` / ``int8_gemv``: exact products of the activations
with the stored codes, float32 sums; 1.4-1.8x torch's int4 kernel and 3.5x its int8 one
on SmolLM2's shapes at one row). Otherwise torch's own:

- int4: ``torch.ops.aten._weight_int4pack_mm_for_cpu`` on CPU and ``_weight_int4pack_mm``
  (the "tinygemm" kernel) on CUDA, with per-group scales and zero points packed as
  ``[K/G, N, 2]`` and dequantization ``w = (q - 8) · scale + zero`` (so ``zero = offset
  + 8 · scale`` in ``houchu.model.quant.functions``'s ``q · scale + offset`` form).
- int8 weight-only: ``torch.ops.aten._weight_int8pack_mm`` (per-channel scales).

Kernel choice by batch size: at decode batch sizes the step is bandwidth-bound and the
quantized kernels read 2-4x fewer bytes; for more rows these weight-only kernels are
slower than a dense matmul. The CPU kernels cost about as much per row as a matrix-vector
product (measured on the benchmark machine, SmolLM2-135M, whole decode steps, 1 thread:
int4 19.6 / 31.1 / 101 ms CPU per step at 1 / 4 / 16 sequences against 34.5 / 36.4 /
67.1 ms for dense bf16 with oneDNN's prepacked weights), so on a CPU with oneDNN each
layer also keeps a dequantized, prepacked copy of its weight in the activation dtype and
uses it from ``dense_min_rows`` rows up (memory for speed: the copy costs the bf16 bytes;
``dense_min_rows=None`` drops it and dequantizes on the fly from ``dequant_min_rows``
rows instead, as on CUDA, where tinygemm stays fast to larger batches). W8A8 uses the
int8 GEMM from ``w8a8_min_rows`` rows up (compute-bound) and the weight-only int8 kernel
below.

Activations run in bfloat16 where the hardware has it (CPU with AVX512-BF16/AMX, any
CUDA GPU with bf16), else float32; inputs of another dtype are cast in and out.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from houchu.model.linear.decode_route import DecodeRoute
from houchu.model.linear.dense import LinearBase, onednn_available, packed_matmul
from houchu.model.quant.functions import (
    Int4Weight,
    pack_nibbles,
    quantize_int8,
    unpack_nibbles,
)

INT4_DEQUANT_MIN_ROWS = 128  # rows from which int4 dequantize-then-matmul is faster
INT8_DEQUANT_MIN_ROWS = 64  # same for the int8 weight-only kernel
#: The dtype of the scales and offsets in the group headers of houchu's C++ GEMV blob
#: (``int4_pack``), on every ISA level: bfloat16 headers are 64 bytes per 16 features and
#: a group, float32 ones 128, so a Q4_1 model at group 32 streams 11% fewer bytes per
#: decode step (SmolLM2-135M: 101.5 against 114.8 MB at batch 1), which is the batch-1
#: step's bound. The rounding (2^-9 of a scale) is far below int4's own step (1/15 of a
#: group's range); the AVX512-BF16 level always had it.
GEMV_HEADER_DTYPE = torch.bfloat16
#: ... except for a GGUF K-quant or a weight of two planes (a Q5/Q6/Q8 tensor) as stored:
#: their scales (a float16 times a 6- or 8-bit integer) need float32 to stay exact, and
#: a plane of codes up to 15 times 16 × the scale would move a Q8_0 weight by up to half
#: its own step in bfloat16. Measured on Gemma 3 270M Q4_K_M with float32 activations:
#: top-1 agreement with the file's dequantized weights 0.985 with bfloat16 headers, 1.0
#: with these (2 bits a weight more at group 32 for two planes, 1 for Q4_K); with
#: bfloat16 activations 0.992. The layer keeps its scales and offsets in this dtype too.
STORED_HEADER_DTYPE = torch.float32
#: the stored GGUF types that keep bfloat16 headers (a float16 scale, rounded 2^-9)
BF16_HEADER_KINDS = ("", "Q4_0", "Q4_1")
#: group sizes torch's int4 matmuls (CPU and CUDA tinygemm) take; a weight of another
#: (a GGUF Q6_K tensor's 16) runs on houchu's C++ GEMV or is dequantized
TORCH_INT4_GROUPS = (32, 64, 128, 256)
CPU_DENSE_MIN_ROWS = 64  # CPU: rows from which a kept dense prepacked copy beats houchu's GEMV


@functools.cache
def quant_act_dtype(device_type: str) -> torch.dtype:
    """bfloat16 if ``device_type``'s hardware computes in it natively, else float32. On
    the CPU: the active ISA level's native units (``cpu_isa.native_units``: AVX512-BF16
    or AMX at the CPU's own level). oneDNN also says it supports bf16 on AVX-512 CPUs
    without either (Skylake), where it emulates the bf16 products."""
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    native = "bf16" in cpu_isa.native_units(cpu_kernels.active_level())
    return torch.bfloat16 if native else torch.float32


class QuantizedLinear(LinearBase):
    """What the int4 and int8 layers share: an optional dense copy of the weights for
    large row counts (``_dense``) and the weights packed for houchu's C++ GEMV
    (``_cpu_gemv``), both opaque to other modules, which ask ``has_dense`` and
    ``has_gemv``."""

    _dense: torch.Tensor | None
    _cpu_gemv: torch.Tensor | None

    @property
    def has_gemv(self) -> bool:
        """Whether the weights are packed for houchu's C++ GEMV (CPU, kernels loaded)."""
        return self._cpu_gemv is not None

    @property
    def has_dense(self) -> bool:
        """Whether a dense copy of the weights serves steps of many rows."""
        return self._dense is not None


class Int4Linear(QuantizedLinear):
    """Weight-only int4 linear (per-group scales and zero points).

    Args:
        w: the quantized weight (``[N, K]`` codes, ``[N, K/G]`` scale and offset; a
            weight of ``P`` planes stores ``[N, P·K]`` codes and ``[N, P·K/G]`` scales
            and offsets, and the layer multiplies ``[x, ..., x]`` by it: one int4
            product over ``P·K`` inputs on every kernel).
        device: where the layer runs.
        dequant_min_rows: rows from which the weight is dequantized for a dense matmul
            (when no dense copy is kept).
        dense_min_rows: CPU with oneDNN: rows from which a kept dense prepacked copy is
            used; None: keep no copy.
        float_out: an LM head's layer: float32 outputs (logits) from the C++ GEMV
            whatever the activation dtype.
        activations: ``QuantSpec.int4_activations``: on houchu's C++ GEMV, "float"
            multiplies the activations as they are, "int8" quantizes them per group
            first (W4A8: every row count runs there, so no dense copy is kept), "auto"
            follows the measured route's path ("gemv-a8" / "fused-a8": int8).
    Raises:
        ValueError: on CUDA, N not a multiple of 8 or K not a multiple of 32.
    """

    def __init__(
        self,
        w: Int4Weight,
        device: torch.device | str = "cpu",
        dequant_min_rows: int = INT4_DEQUANT_MIN_ROWS,
        dense_min_rows: int | None = CPU_DENSE_MIN_ROWS,
        activations: str = "auto",
        float_out: bool = False,
    ) -> None:
        super().__init__()
        dev = torch.device(device)
        self.out_features, self.in_features = w.shape
        #: the LM head's: float32 logits (the C++ GEMV's float32 sums, never rounded to
        #: bfloat16: near-ties of the top tokens would become exact ties)
        self.float_out = float_out
        self.group_size, self.dequant_min_rows = w.group_size, dequant_min_rows
        #: int4 planes side by side along K (``Int4Weight.planes``), and the GGUF type the
        #: weight is stored as ("" for houchu's own quantization)
        self.planes, self.stored = w.planes, w.kind
        self.k_stored = w.q.shape[1]  # planes · K
        self.activations = activations
        if activations == "int8" and dev.type == "cpu":
            dense_min_rows = None
        self.kind = f"int4-g{w.group_size}"
        act = self.act_dtype = quant_act_dtype(dev.type)
        zero = w.offset + 8.0 * w.scale  # [N, K/G]
        sz = torch.stack((w.scale, zero), dim=-1).transpose(0, 1).contiguous()  # [K/G, N, 2]
        self.register_buffer("sz", sz.to(dev, act))
        q = w.q.to(dev)
        if dev.type == "cuda":
            n, k = w.q.shape  # stored: planes · K inputs
            tiles = next((t for t in (8, 4, 2) if k % (16 * t) == 0), None)
            if n % 8 or tiles is None:
                raise ValueError(f"CUDA int4 kernel needs N % 8 == 0 and K % 32 == 0, got {n}x{k}")
            hi_lo = (q[:, 0::2] << 4) | q[:, 1::2]  # tinygemm's nibble order
            packed = torch.ops.aten._convert_weight_to_int4pack(hi_lo.contiguous(), tiles)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        self.register_buffer("packed", packed)  # kernel layout, opaque
        # a plain nibble copy for the dequantize-then-matmul path
        self.register_buffer("nibbles", pack_nibbles(q))  # [N, K/2] uint8
        #: the GEMV's group headers' dtype (``BF16_HEADER_KINDS``); the scales and offsets
        #: are kept in it (float32: a stored K-quant's exact values), else in act
        self.header_dtype = (
            GEMV_HEADER_DTYPE
            if self.planes == 1 and self.stored in BF16_HEADER_KINDS
            else STORED_HEADER_DTYPE
        )
        keep = act if self.header_dtype == GEMV_HEADER_DTYPE else STORED_HEADER_DTYPE
        self.register_buffer("scale", w.scale.to(dev, keep))  # [N, P·K/G]
        self.register_buffer("offset", w.offset.to(dev, keep))  # [N, P·K/G]
        self._dense = _dense_copy(self.dequantize(), dev, dense_min_rows)  # opaque, not a buffer
        self.dense_min_rows = dense_min_rows if self._dense is not None else None
        self._cpu_gemv: torch.Tensor | None = None  # houchu's C++ GEMV layout (opaque)
        self.route: DecodeRoute | None = None  # measured decode paths (gpu.autotune)
        #: batch-invariant GEMV sums (``houchu.runner.deterministic``)
        self.batch_invariant = False
        self.prepare_cpu_gemv()

    def prepare_cpu_gemv(self) -> None:
        """Lay the weight out for houchu's C++ GEMV, on the CPU once the kernels are
        loaded (a layer built before they were gets it here)."""
        if self._cpu_gemv is not None or self.scale.device.type != "cpu":
            return
        if cpu_kernels.is_loaded() and self.group_size % 8 == 0:
            q = unpack_nibbles(self.nibbles).view(self.out_features, self.k_stored)
            header = self.header_dtype
            self._cpu_gemv = cpu_kernels.ops().int4_pack(
                q, self.scale.to(header), self.offset.to(header), self.group_size
            )

    def weight_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + _nbytes(self.sz)

    def weight_bytes_at(self, rows: int) -> int:
        if _gemv_at(self, rows):  # its own layout: group headers of 64 or 128 bytes
            return _nbytes(self._cpu_gemv)
        if self.dense_min_rows is not None and rows >= self.dense_min_rows:
            return self.out_features * self.in_features * self.act_dtype.itemsize
        return self.weight_bytes()

    def gemv_blob(self, rows: int) -> tuple[torch.Tensor, int] | None:
        # the fused decode layers read x once per weight: a weight of planes is not theirs
        if self.planes > 1 or not _gemv_at(self, rows):
            return None
        return self._cpu_gemv, self.group_size

    def dequantize(self) -> torch.Tensor:
        """The dense weight ``[N, K]`` in the activation dtype (planes summed in float32)."""
        n, kp, g = self.out_features, self.k_stored, self.group_size
        q = unpack_nibbles(self.nibbles).view(n, kp // g, g)
        if self.planes == 1:
            q = q.to(self.scale.dtype)  # act dtype, or float32 for exact headers
            w1 = torch.addcmul(self.offset[..., None], q, self.scale[..., None]).view(n, kp)
            return w1.to(self.act_dtype)
        w = torch.addcmul(self.offset.float()[..., None], q.float(), self.scale.float()[..., None])
        return w.view(n, self.planes, -1).sum(dim=1).to(self.act_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[M, K]`` -> ``[M, N]``, same dtype as x."""
        xa = x.to(self.act_dtype)
        path = _route(self, x.shape[0])
        if self.float_out and self._cpu_gemv is not None:
            # an LM head: float32 logits at every row count, whatever the route (the
            # other paths round them to the activation dtype, and a request's logits
            # would then depend on how many rows share its step)
            g, n, inv = self.group_size, self.out_features, self.batch_invariant
            return cpu_kernels.ops().int4_gemv(
                self._per_plane(xa), self._cpu_gemv, g, n, False, inv, True
            )
        if self._cpu_gemv is not None and int8_acts(self, path):
            y = cpu_kernels.ops().int4_gemv(
                self._per_plane(xa), self._cpu_gemv, self.group_size, self.out_features, True
            )
        elif path == "dense" or (path is None and _dense_at(self, x.shape[0])):
            y = packed_matmul(xa, self._dense, self.out_features)
        elif path is None and x.shape[0] >= self.dequant_min_rows:
            y = F.linear(xa, self.dequantize())
        elif self._cpu_gemv is not None and path != "torch":
            y = cpu_kernels.ops().int4_gemv(
                self._per_plane(xa),
                self._cpu_gemv,
                self.group_size,
                self.out_features,
                False,
                self.batch_invariant,
            )
        elif self.group_size not in TORCH_INT4_GROUPS:  # groups of 16: no torch kernel
            y = F.linear(xa, self.dequantize())
        elif self.packed.device.type == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(
                self._per_plane(xa), self.packed, self.group_size, self.sz
            )
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                self._per_plane(xa), self.packed, self.group_size, self.sz
            )
        return y.to(x.dtype)

    def _per_plane(self, xa: torch.Tensor) -> torch.Tensor:
        """The int4 kernels' input: ``[M, K]`` -> ``[M, P·K]``, x once per plane (the
        dense paths take ``xa`` itself)."""
        return xa if self.planes == 1 else xa.repeat(1, self.planes)


class Int8Linear(QuantizedLinear):
    """Weight-only int8 linear (symmetric per-channel scales).

    Args:
        w: ``[N, K]`` float weight, quantized here.
        device: where the layer runs.
        dequant_min_rows: rows from which the weight is dequantized for a dense matmul
            (when no dense copy is kept).
        dense_min_rows: CPU with oneDNN: rows from which a kept dense prepacked copy is
            used; None: keep no copy.
    """

    def __init__(
        self,
        w: torch.Tensor,
        device: torch.device | str = "cpu",
        dequant_min_rows: int = INT8_DEQUANT_MIN_ROWS,
        dense_min_rows: int | None = CPU_DENSE_MIN_ROWS,
    ) -> None:
        super().__init__()
        dev = torch.device(device)
        self.out_features, self.in_features = w.shape
        self.kind, self.dequant_min_rows = "int8", dequant_min_rows
        self.act_dtype = quant_act_dtype(dev.type)
        q, scale = quantize_int8(w)
        self.register_buffer("q", q.to(dev))  # [N, K] int8
        self.register_buffer("wscale", scale.to(dev))  # [N] float32
        self.register_buffer("wscale_act", scale.to(dev, self.act_dtype))  # [N]
        self.kernel = _int8pack_works(dev.type, self.act_dtype)
        dense = self.q.to(self.act_dtype) * self.wscale_act[:, None]  # [N, K]
        self._dense = _dense_copy(dense, dev, dense_min_rows)  # opaque, not a buffer
        self.dense_min_rows = dense_min_rows if self._dense is not None else None
        self._cpu_gemv: torch.Tensor | None = None  # houchu's C++ GEMV layout (opaque)
        self.route: DecodeRoute | None = None  # measured decode paths (gpu.autotune)
        #: float32 outputs (the LM head: logits), never rounded to a bf16 act dtype
        self.float_out = False
        self.prepare_cpu_gemv()

    def prepare_cpu_gemv(self) -> None:
        """Lay the weight out for houchu's C++ GEMV, on the CPU once the kernels are
        loaded (a layer built before they were gets it here)."""
        if self._cpu_gemv is None and self.q.device.type == "cpu" and cpu_kernels.is_loaded():
            self._cpu_gemv = cpu_kernels.ops().int8_pack(self.q, self.wscale_act)

    def weight_bytes(self) -> int:
        return self.q.numel() + _nbytes(self.wscale_act)

    def weight_bytes_at(self, rows: int) -> int:
        if _gemv_at(self, rows):
            return _nbytes(self._cpu_gemv)
        if self.dense_min_rows is not None and rows >= self.dense_min_rows:
            return self.out_features * self.in_features * self.act_dtype.itemsize
        return self.weight_bytes()

    def gemv_blob(self, rows: int) -> tuple[torch.Tensor, int] | None:
        if not _gemv_at(self, rows):
            return None
        return self._cpu_gemv, 0

    def _weight_only(self, xa: torch.Tensor) -> torch.Tensor:
        """xa: ``[M, K]`` act dtype -> ``[M, N]`` act dtype (float32 with ``float_out``
        on the C++ GEMV, which a ``float_out`` layer runs at every row count of
        bfloat16 activations)."""
        if _float_gemv_at(self, xa.shape[0]):
            return cpu_kernels.ops().int8_gemv(xa, self._cpu_gemv, self.out_features, True)
        path = _route(self, xa.shape[0])
        if path == "dense" or (path is None and _dense_at(self, xa.shape[0])):
            return packed_matmul(xa, self._dense, self.out_features)
        if base_path(path) in ("gemv", "fused") or (
            path is None and xa.shape[0] < self.dequant_min_rows
        ):
            if self._cpu_gemv is not None:
                blob, n = self._cpu_gemv, self.out_features
                return cpu_kernels.ops().int8_gemv(xa, blob, n, self.float_out)
        if self.kernel and (path == "torch" or xa.shape[0] < self.dequant_min_rows):
            return torch.ops.aten._weight_int8pack_mm(xa, self.q, self.wscale_act)
        return F.linear(xa, self.q.to(xa.dtype)) * self.wscale_act  # int8 is exact in bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[M, K]`` -> ``[M, N]``, same dtype as x (a ``float_out`` layer: float32
        where its kernel gave float32)."""
        y = self._weight_only(x.to(self.act_dtype))  # [M, N]
        return y if self.float_out and y.dtype == torch.float32 else y.to(x.dtype)


def _float_gemv_at(layer: Int8Linear, rows: int) -> bool:
    """Whether ``layer`` runs ``rows`` rows on the C++ GEMV for float32 outputs: an LM
    head (``Int8Linear.float_out``) with bfloat16 activations, at every row count
    whatever the route says. The dense and torch paths round logits to bfloat16 (steps
    of 1/16 at a logit of 16: near-ties of the top tokens become exact ties, broken by
    token id), so a head that took them above some row count would give a request other
    logits beside other requests than alone. The GEMV (row-invariant) costs no more:
    49152x576 on 2 AVX-512 cores, 16.5 / 32.3 / 58.7 ms at 32 / 64 / 128 rows against
    15.6 / 35.1 / 51.3 ms for the dense bfloat16 copy."""
    del rows  # every row count
    return layer.float_out and layer.has_gemv and layer.act_dtype == torch.bfloat16


def base_path(path: str | None) -> str | None:
    """A route path without its activation format: "gemv-a8" -> "gemv"."""
    return path.removesuffix("-a8") if path is not None else None


def int8_acts(layer: Int4Linear, path: str | None) -> bool:
    """Whether ``layer`` quantizes its activations to int8 on a step the route gives
    ``path`` (None: no route; then its ``activations`` option decides). Never an LM
    head's (``float_out``: its logits keep float32 activations)."""
    if layer.float_out:
        return False
    if path is not None:
        return path.endswith("-a8")
    return layer.activations == "int8"


def _route(layer: Int4Linear | Int8Linear, rows: int) -> str | None:
    """The path the model's measured decode route (``houchu.runner.autotune``) gives a step
    of ``rows`` rows ("fused", "gemv", "torch" or "dense"), or None: the layer's own
    row thresholds decide."""
    route = layer.route
    path = route.path_for(rows) if route is not None else None
    if path == "dense" and not layer.has_dense:
        return None
    return path


def _nbytes(t: torch.Tensor | None) -> int:
    """Bytes of ``t``'s elements (0 for None)."""
    return 0 if t is None else t.numel() * t.element_size()


def _gemv_at(layer: Int4Linear | Int8Linear, rows: int) -> bool:
    """Whether ``rows`` rows run on houchu's C++ GEMV (the route's choice, else below the
    dense and dequantize thresholds)."""
    if not layer.has_gemv:
        return False
    if isinstance(layer, Int8Linear) and _float_gemv_at(layer, rows):
        return True
    path = _route(layer, rows)
    if path is not None:
        return base_path(path) in ("gemv", "fused")
    if isinstance(layer, Int4Linear) and layer.activations == "int8":
        return True
    return not _dense_at(layer, rows) and rows < layer.dequant_min_rows


def _dense_at(layer: Int4Linear | Int8Linear, rows: int) -> bool:
    """Whether ``rows`` rows run on the layer's kept dense prepacked copy."""
    return layer.dense_min_rows is not None and rows >= layer.dense_min_rows


def _dense_copy(w: torch.Tensor, device: torch.device, min_rows: int | None) -> torch.Tensor | None:
    """A oneDNN-prepacked dense copy of ``w`` ``[N, K]`` (opaque layout; CPU only, when
    oneDNN takes its dtype and ``min_rows`` is set), else None."""
    if min_rows is None or device.type != "cpu" or not onednn_available(w.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous())


@functools.cache
def _int8pack_works(device_type: str, act_dtype: torch.dtype) -> bool:
    """Whether ``_weight_int8pack_mm`` runs on this device and dtype (probed once)."""
    try:
        x = torch.randn(2, 32, device=device_type, dtype=act_dtype)
        q = torch.randint(-127, 127, (8, 32), dtype=torch.int8, device=device_type)
        s = torch.rand(8, device=device_type, dtype=act_dtype)
        y = torch.ops.aten._weight_int8pack_mm(x, q, s)
        want = F.linear(x.float(), q.float()) * s.float()
        return bool(torch.allclose(y.float(), want, rtol=0.05, atol=0.05 * float(want.abs().max())))
    except (RuntimeError, NotImplementedError):
        return False
