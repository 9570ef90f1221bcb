"""Batch-invariant ("deterministic") inference on the CPU: ``houchu serve --deterministic``
(SGLang's ``--enable-deterministic-inference``, vLLM's batch-invariant mode).

Without it a request's logits depend on the other rows of its step in their last bits:
the measured decode route (``houchu.runner.autotune``) gives batch buckets and prefill
different kernels (of one family: the same activation format and weight rounding),
torch's packed kernels and oneDNN's dense matmuls split a row's sums differently at
different row counts, and houchu's own int4 GEMV keeps more accumulator chains per row in
a tile of few rows than in one of many (except in its batch-invariant form, which the
measured route uses at the AVX-512 levels).
So a seeded request can sample different tokens beside other traffic.

The mode pins, as Thinking Machines' "Defeating Nondeterminism in LLM Inference" (2025)
and SGLang's deterministic mode do, one reduction order per row whatever the batch:

- quantized models: every step, decode or prefill, of any row count, on houchu's C++
  GEMV (route ``gemv``, never the fused layers, ``torch``, ``dense`` or an ``-a8``
  path) with float activations and ``int4_gemv(batch_invariant=True)`` (the same
  accumulator chains at every tile size); the int8 LM head's GEMV is already
  row-invariant;
- dense matmuls (``Linear``: the exact path, ``--quantization none``): in calls of
  exactly ``ROW_TILE`` rows, the last one zero-padded (a oneDNN call's reduction order
  depends on its row count, not on which of its rows a row is);
- no compiled step (Inductor specializes kernels per shape), and a fixed thread count
  (no thread governor: oneDNN may split a row's sum over the threads).

Attention (paged decode and tiled prefill, per sequence), the norms, RoPE and the
sampler (one generator per seeded row, ``houchu.model.sampling.sampler``) are row-wise already.
"""

from __future__ import annotations

import msgspec
import torch

from houchu.model.linear.dense import Linear, LinearBase
from houchu.model.linear.quantized import Int4Linear, Int8Linear
from houchu.options.runner_options import RunnerOptions
from houchu.runner.autotune import DecodeRoute, attach
from houchu.startup_errors import StartupFailure

#: Rows per dense matmul call in the mode: a decode step of one row computes this many
#: (zeros past the first; SmolLM2-135M's exact path measured 1.13x the default's step
#: time at one row, README); a prefill of 128 tokens makes 16 calls.
ROW_TILE = 8


class DeterministicUnsupported(StartupFailure, ValueError):
    """``--deterministic`` asked where houchu cannot make it hold (the message says why;
    a runner that meets it at start-up reports the one line, no traceback)."""


def deterministic_options(o: RunnerOptions, device: torch.device) -> RunnerOptions:
    """``o`` checked (``check_options``) and as the mode runs it: no compiled step, a
    fixed thread count, no measured route (``pin`` pins it), float int4 activations.

    Raises:
        DeterministicUnsupported: as ``check_options``.
    """
    check_options(o, device)
    return msgspec.structs.replace(
        o, compile="off", fixed_threads=True, decode_paths="rules", int4_activations="float"
    )


def check_options(o: RunnerOptions, device: torch.device) -> None:
    """Refuse the options the mode cannot combine with.

    Raises:
        DeterministicUnsupported: not on the CPU, tensor parallel, int8 activations or
            W8A8 (``pin`` refuses a quantized model without houchu's C++ kernels).
    """
    if device.type != "cpu":
        raise DeterministicUnsupported(f"--deterministic runs on the CPU only, not {device}")
    if o.tensor_parallel_size > 1:
        raise DeterministicUnsupported("--deterministic does not combine with tensor parallel")
    if o.int4_activations == "int8":
        raise DeterministicUnsupported(
            "--deterministic pins float activations: drop --int4-activations int8"
        )
    if o.quantization == "w8a8":
        raise DeterministicUnsupported("--deterministic does not cover --quantization w8a8")


def pin(model: torch.nn.Module, buckets: tuple[int, ...], backend: object) -> str:
    """Make ``model``'s matmuls batch-invariant (the module docstring's list), run every
    sequence's attention on ``backend``'s prefill kernel (so a prompt prefilled whole, in
    chunks or ending in a one-token chunk, and a decode row, meet one kernel:
    ``TorchSDPABackend.one_kernel``), and say what
    was pinned, e.g. "every step on houchu's C++ GEMV (float activations, batch-invariant
    sums); compile off; 2 fixed threads".

    Raises:
        DeterministicUnsupported: a quantized linear without houchu's C++ GEMV layout (the
            kernels not loaded) or a linear kind the mode does not cover.
    """
    quantized, dense = [], []
    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            if not m.has_gemv:
                raise DeterministicUnsupported(
                    "--deterministic needs houchu's C++ CPU kernels for the quantized "
                    "layers (not built or --cpu-isa generic)"
                )
            quantized.append(m)
        elif isinstance(m, Linear):
            dense.append(m)
        elif isinstance(m, LinearBase):
            raise DeterministicUnsupported(f"--deterministic does not cover {m.kind} layers")
    parts = []
    if quantized:
        attach(model, DecodeRoute({max(buckets, default=1): "gemv"}, prefill="gemv"))
        for m in quantized:
            m.batch_invariant = True
        parts.append(
            "every step (decode and prefill, any row count) on houchu's C++ GEMV, float "
            "activations, batch-invariant sums"
        )
    for m in dense:
        m.row_tile = ROW_TILE
    if hasattr(backend, "one_kernel"):  # every row attends on the prefill kernel
        backend.one_kernel = True
    if dense:
        parts.append(f"dense matmuls in calls of {ROW_TILE} rows")
    parts.append(f"compile off; {torch.get_num_threads()} fixed threads")
    return "; ".join(parts)


def pinned_notes(pinned: str) -> list[str]:
    """The startup line of the mode (``pin``'s text; none when ``pinned`` is "")."""
    return [f"deterministic inference on (batch-invariant): {pinned}"] if pinned else []
