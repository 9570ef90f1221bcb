"""What "auto" means for the runner's dtype, KV page size and attention backend on the
device it runs on, decided once at start-up and said on the start-up line.

- ``--dtype auto``: bfloat16 on a CUDA GPU (as vLLM and SGLang; float16 where the GPU has
  no native bfloat16), float32 on the CPU (the exact path, as before).
- ``--page-size`` unset: 16 tokens; 256 on CUDA where ``--attention-backend auto`` picks
  flash-attn, whose paged KV needs a multiple of 256 (``FLASH_PAGE_MULTIPLE``).
- ``--attention-backend auto`` on CUDA: flash-attn where it imports and can serve the
  pool (page size a multiple of 256, fp16/bf16 model and KV); else houchu's Triton
  kernels where Triton runs (installed, and one tiny kernel compiled and launched on the
  device), else torch SDPA; each fallback with its reason. On
  the CPU "auto" stays for ``houchu.runner.backends.make_backend`` (the C++ kernels).

The decisions are pure functions of what the device offers (``choose_dtype``,
``choose_attention``), tested on the CPU; ``resolve_dtype`` and ``resolve_attention``
ask torch and apply them to ``RunnerOptions``. The launcher sizes the host KV tier's
slots with the same resolution (``houchu.actors.kv_tier_setup``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import torch

from houchu.gpu.flash_attention import FLASH_PAGE_MULTIPLE
from houchu.options.runner_options import RunnerOptions

#: Tokens per KV page when ``--page-size`` is not given and flash-attn is not chosen.
DEFAULT_PAGE_SIZE = 16
HALF_DTYPES = ("bfloat16", "float16")


def choose_dtype(requested: str, device_type: str, bf16_supported: bool) -> str:
    """The compute dtype ``--dtype requested`` means on ``device_type`` ("cuda"/"cpu"):
    "auto" is bfloat16 on CUDA (float16 without native bfloat16), float32 elsewhere."""
    if requested != "auto":
        return requested
    if device_type == "cuda":
        return "bfloat16" if bf16_supported else "float16"
    return "float32"


@dataclass(frozen=True)
class AttentionChoice:
    """The attention backend and page size chosen, and why (empty: nothing to say).

    Attributes:
        backend: the ``--attention-backend`` to build ("auto" on the CPU).
        page_size: tokens per KV page.
        note: the choice and its reason, for the start-up line ("" when the user's
            flags decided alone).
    """

    backend: str
    page_size: int
    note: str = ""


def _flash_obstacle(
    page_size: int | None, dtype: str, kv_dtype: str, flash: bool, mla: bool
) -> str | None:
    """Why flash-attn cannot serve this pool (None: it can)."""
    if mla:
        return "MLA attends on torch ops"
    if not flash:
        return "flash-attn does not import here (pip install 'houchu[gpu]')"
    if dtype not in HALF_DTYPES:
        return f"flash-attn computes in fp16/bf16, not --dtype {dtype}"
    if kv_dtype != "auto":
        return f"flash-attn reads fp16/bf16 KV only, not --kv-cache-dtype {kv_dtype}"
    if page_size is not None and page_size % FLASH_PAGE_MULTIPLE:
        return (
            f"--page-size {page_size} is not a multiple of {FLASH_PAGE_MULTIPLE} "
            "(flash-attn's paged KV needs one)"
        )
    return None


def choose_attention(
    requested: str,
    device_type: str,
    page_size: int | None,
    *,
    dtype: str,
    kv_dtype: str = "auto",
    flash: bool = False,
    triton: bool = False,
    mla: bool = False,
    triton_why: str = "",
) -> AttentionChoice:
    """The backend and page size for ``--attention-backend requested`` and ``--page-size
    page_size`` (None: not given) on ``device_type``, given whether flash-attn imports
    (``flash``), Triton runs there (``triton``; where not, ``triton_why`` says why, and
    the note says it) and the model is MLA (``mla``).

    Raises:
        ValueError: a page size below 1.
    """
    if page_size is not None and page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if requested == "flash-attn" and page_size is None:
        note = f"--page-size {FLASH_PAGE_MULTIPLE} for flash-attn (its paged KV needs a multiple)"
        return AttentionChoice(requested, FLASH_PAGE_MULTIPLE, note)
    if requested != "auto" or device_type != "cuda":
        return AttentionChoice(requested, page_size or DEFAULT_PAGE_SIZE)
    why = _flash_obstacle(page_size, dtype, kv_dtype, flash, mla)
    no_triton = f"not triton: {triton_why}" if not triton and triton_why else ""
    if why is None:
        notes = []
        if page_size is None:
            notes.append(
                f"attention flash-attn with --page-size {FLASH_PAGE_MULTIPLE} (its paged KV "
                f"needs a multiple of {FLASH_PAGE_MULTIPLE}; --page-size overrides)"
            )
        if no_triton:  # flash-attn's glue kernels then run on torch ops
            notes.append(f"kernels torch, {no_triton}")
        return AttentionChoice("flash-attn", page_size or FLASH_PAGE_MULTIPLE, "; ".join(notes))
    fallback = "triton" if triton else "torch"
    note = "" if mla else f"attention {fallback}, not flash-attn: {why}"
    if no_triton and not mla:
        note = f"attention torch SDPA, not flash-attn: {why}; {no_triton}"
    return AttentionChoice(fallback, page_size or DEFAULT_PAGE_SIZE, note)


def resolve_dtype(o: RunnerOptions, device: torch.device) -> tuple[RunnerOptions, str]:
    """``o`` with ``dtype`` concrete for ``device`` (``choose_dtype``), and what "auto"
    chose, said on every device ("--dtype auto: float32 on cpu"; "" when the dtype was
    given)."""
    if o.dtype != "auto":
        return o, ""
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    dtype = choose_dtype("auto", device.type, bf16)
    note = f"--dtype auto: {dtype} on {'CUDA' if device.type == 'cuda' else device.type}"
    return msgspec.structs.replace(o, dtype=dtype), note


def resolve_attention(
    o: RunnerOptions,
    device: torch.device,
    mla: bool = False,
    triton_launch: Callable[[torch.device], None] | None = None,
) -> tuple[RunnerOptions, str]:
    """``o`` with ``page_size`` concrete and, on CUDA, ``attention_backend`` too
    (``choose_attention``, asking whether flash-attn imports and whether Triton runs on
    ``device``: ``houchu.gpu.triton.probe.triton_unusable``, whose probe compiles and launches
    one tiny kernel there, once per process; ``triton_launch`` replaces that probe), and
    the choice's note ("" when none). ``o.dtype`` must be concrete (``resolve_dtype``).

    Raises:
        ValueError: a page size below 1.
    """
    flash = triton = False
    triton_why = ""
    if device.type == "cuda" and o.attention_backend == "auto":
        from houchu.gpu.flash_attention import flash_attn_importable
        from houchu.gpu.triton.probe import triton_probe_launch, triton_unusable

        flash = flash_attn_importable()
        triton_why = triton_unusable(device, triton_launch or triton_probe_launch) or ""
        triton = not triton_why
    c = choose_attention(
        o.attention_backend,
        device.type,
        o.page_size,
        dtype=o.dtype,
        kv_dtype=o.kv_cache_dtype,
        flash=flash,
        triton=triton,
        mla=mla,
        triton_why=triton_why,
    )
    return msgspec.structs.replace(o, attention_backend=c.backend, page_size=c.page_size), c.note
