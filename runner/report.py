"""The clauses of a ``ModelRunner``'s start-up line (``ModelRunner.summary``) that are
facts of their own: the device, CUDA graphs, the matmul sizes and the decode paths."""

from __future__ import annotations

import torch

from houchu.gpu.memory import DeviceFacts
from houchu.model.config.core import ModelConfig, num_parameters
from houchu.runner.autotune import FAMILY_TEXT, Tuned


def device_clause(device: torch.device, facts: DeviceFacts | None) -> str:
    """ "cuda:0 (NVIDIA H200, 139.8 GiB, 120.3 GiB free after the weights)" with a GPU's
    facts, else the device alone ("cpu")."""
    return str(device) if facts is None else f"{device} ({facts.describe()})"


def cuda_graph_clause(
    device_type: str,
    kind: str | None,
    buckets: tuple[int, ...],
    disabled: bool,
    static_backend: bool,
) -> str:
    """Whether decode steps replay CUDA graphs, and for which batch buckets: "CUDA graphs
    for batch 1,2,4"; "no CUDA graphs (REASON)"; "" off CUDA (where graphs do not
    apply). ``kind``: the decode accelerator's (``DecodeAccelerator.kind``)."""
    if device_type != "cuda":
        return ""
    if kind == "cuda_graph":
        return f"CUDA graphs for batch {','.join(map(str, buckets))}"
    if disabled:
        why = "--disable-cuda-graph"
    elif not static_backend:
        why = "the attention backend has no static decode path"
    else:
        why = "this model's decode step cannot be captured, see above"
    return f"no CUDA graphs ({why})"


def matmul_note(c: ModelConfig) -> str:
    """ "matmul 77.9M/token, LM head 28.3M": the weights one token's forward multiplies
    (decoder layers, active experts only) and the LM head's, which multiplies only the
    rows that sample (``config.num_parameters``); the roofline counts FLOPs from these."""
    n = num_parameters(c)
    head = c.vocab_size * c.hidden_size
    return f"matmul {(n.matmul_per_token - head) / 1e6:.1f}M/token, LM head {head / 1e6:.1f}M"


def decode_paths_text(t: Tuned | None) -> str:
    """``ModelRunner.decode_paths``: the measured decode path per bucket and the times
    ("" when not tuned)."""
    if t is None:
        return ""
    if t.cached:
        how = "provisional cached measurement" if t.provisional else "cached measurement"
        how += "; cores still busy" if t.contended else ""
    else:
        how = f"measured in {t.took_s:.1f}s"
        how += "; cores contended" if t.contended else ""
        how += "; time budget reached" if t.truncated else ""
        if not t.stored:
            how += "; not cached"
        elif t.provisional:
            how += "; cached as provisional"
    fam = ""
    if t.family is not None:  # chosen once for every row count (autotune.choose_family)
        others = ", ".join(f"{f} {x:.2f}x" for f, x in (t.others_slower or {}).items())
        fam = f"; every row count on one kernel family: {FAMILY_TEXT[t.family]}"
        fam += f" ({others} the time)" if others else ""
    return f"{t.route.describe(t.times, t.prefill_times)}{fam} [{how}]"
