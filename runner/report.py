"""What a ``ModelRunner`` says about itself: its start-up line and the ledger's samples
of every lever it runs (``ModelRunner.summary`` and ``ModelRunner.lever_samples``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from houchu.gpu.memory import DeviceFacts
from houchu.model.config.core import ModelConfig, num_parameters
from houchu.model.moe import MoEMLP, moe_lever_sample
from houchu.runner.autotune import FAMILY_TEXT, Tuned
from houchu.runner.mla_lever import mla_summary
from houchu.transport.messages import RunnerInfo
from houchu.transport.telemetry import LeverSample

if TYPE_CHECKING:
    from houchu.runner.model_runner import ModelRunner


def runner_summary(r: ModelRunner, load_s: float | None = None) -> str:
    """One line: architecture, parameters, dtype, the device (on CUDA the GPU's name and
    memory), KV pool geometry and bytes and which option sized it, the attention backend
    and CUDA graphs, kernels, threads, the levers' summary, the measured decode paths and
    what "auto" chose on this device."""
    p = r.pool
    took = "" if load_s is None else f" (loaded in {load_s:.1f}s)"
    static = getattr(r.backend, "supports_static", False)
    disabled = r.options.disable_cuda_graph
    graphs = cuda_graph_clause(r.device.type, r.accel.kind, _graph_buckets(r), disabled, static)
    return (
        f"houchu runner: {r.config.architecture} {r.config.name!r}, "
        f"{r.num_params / 1e6:.1f}M params ({_matmul_note(r.config)}), "
        f"{str(r.dtype).removeprefix('torch.')} on {device_clause(r.device, r.device_facts)}, "
        f"{r.config.num_layers} layers, KV pool {p.num_pages} pages x {p.page_size} = "
        f"{p.num_tokens} tokens, {p.num_bytes / 2**20:.1f} MiB "
        f"({p.bytes_per_token} B/token) sized by {r.pool_size.source}, "
        f"max context {r.max_context}, attention {r.backend.name}"
        f"{', ' + graphs if graphs else ''}, kernels {r.model.ops.name} "
        f"(CPU ISA {r.cpu_isa}){_build_note(r)}"
        f"{' with fused decode layers' if r.model.fused and r.model.fused.applies(1) else ''}, "
        f"matmul {'onednn-packed' if r.model.prepacked else 'dense'}, "
        f"{torch.get_num_threads()} threads{took}; {r.levers.summary()}"
        f"{'; decode paths ' + r.decode_paths() if r.tuned else ''}"
        f"{'; ' + mla_summary(p, r.max_context) if r.mla_lever else ''}"
        f"{''.join('; ' + c for c in r.choices)}"
    )


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


def _graph_buckets(r: ModelRunner) -> tuple[int, ...]:
    """The batch buckets the CUDA graphs were captured for (the options' otherwise)."""
    return tuple(getattr(r.accel.impl, "buckets", r.options.decode_batch_sizes))


def _matmul_note(c: ModelConfig) -> str:
    """ "matmul 77.9M/token, LM head 28.3M": the weights one token's forward multiplies
    (decoder layers, active experts only) and the LM head's, which multiplies only the
    rows that sample (``config.num_parameters``); the roofline counts FLOPs from these."""
    n = num_parameters(c)
    head = c.vocab_size * c.hidden_size
    return f"matmul {(n.matmul_per_token - head) / 1e6:.1f}M/token, LM head {head / 1e6:.1f}M"


def _build_note(r: ModelRunner) -> str:
    """ " (C++ kernels built in N s)" when this process compiled them."""
    took = getattr(r.backend, "build_s", 0.0)
    return f" (C++ kernels built in {took:.0f}s)" if took >= 1.0 else ""


def runner_lever_samples(r: ModelRunner) -> list[LeverSample]:
    """``ModelRunner.lever_samples``: the engine-wide ``LeverSample``s since the last
    call."""
    out = [*r.levers.samples(), *r.grammar.samples(), *r.jump.samples()]
    now = time.time()
    if r.tp is not None:
        from houchu.runner.tensor_parallel.shards import tp_lever_sample

        out.append(tp_lever_sample(r.tp, r.model.weight_bytes()[0], now))
    moes = (m for m in r.model.modules() if isinstance(m, MoEMLP))
    moe = moe_lever_sample(moes, now)
    if r.mla_lever is not None:
        out += r.mla_lever.samples(now)
    if moe is not None:
        out.append(moe)
    skipped = r.window_ledger.take()
    if skipped:
        out.append(
            LeverSample(
                "sliding_window_attention", "move_less", skipped, "bytes", 0.0, "bytes", now
            )
        )
    return out


def runner_info(r: ModelRunner) -> RunnerInfo:
    """``ModelRunner.info``: the runner's geometry and limits."""
    c = r.config if r.tp is None else r.model.full_cfg
    ranks = 1 if r.tp is None else r.tp.world  # each holds 1/ranks of the KV
    return RunnerInfo(
        num_pages=r.pool.num_pages,
        page_size=r.pool.page_size,
        max_context=r.max_context,
        kv_bytes_per_token=r.pool.bytes_per_token * ranks,
        num_params=r.num_params,
        model_name=r.config.name,
        num_nonembed_params=num_parameters(c).non_embedding,
        attn_flops_per_pair=4 * c.num_layers * c.num_heads * c.head_dim,
        vocab_size=c.vocab_size,
        device_type=r.device.type,
        num_threads=torch.get_num_threads(),
        cpu_isa=r.cpu_isa if r.device.type == "cpu" else "",
        decode_paths=decode_paths_text(r.tuned),
        deterministic=r.deterministic,
        sliding_window=c.sliding_window if c.every_layer_windowed else 0,
    )


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
