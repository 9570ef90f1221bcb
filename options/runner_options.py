"""The model runner's options: the "model runner" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from houchu.cpu import isa as cpu_isa
from houchu.options.bounds import Positive, checked

_CPU_ISA_CHOICES = ("auto", *cpu_isa.NAMES)
CpuIsa = Literal[_CPU_ISA_CHOICES]  # type: ignore[valid-type]  # built from the level table


class RunnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How ``houchu.runner.model_runner.ModelRunner`` loads and runs a model; each field is the
    ``houchu serve`` flag of its name.

    Attributes:
        device: "auto" (CUDA when torch sees a GPU, else the CPU), "cpu", "cuda" or
            "cuda:N" (``houchu.model.device.resolve_device``).
        dtype: weight, activation and KV dtype; "auto": bfloat16 on CUDA (float16
            without native bfloat16), float32 on the CPU
            (``houchu.runner.choices.choose_dtype``).
        page_size: tokens per KV page (None: 16, or 256 on CUDA where the auto attention
            backend picks flash-attn: ``houchu.runner.choices.choose_attention``).
        num_pages: KV pool size in pages (None: sized from ``mem_fraction_static`` on
            CUDA, else ``kv_cache_mb``).
        kv_cache_mb: KV pool budget, MiB, fractions allowed (used when ``num_pages`` is
            None, and on CUDA ``mem_fraction_static`` too).
        mem_fraction_static: on CUDA, the fraction of the GPU's memory the weights and
            the KV pool may hold together (SGLang's flag; vLLM's
            ``--gpu-memory-utilization``): the pool gets it less what is in use after
            the weights load and an activation reserve (``houchu.gpu.memory``).
            In (0, 1]; ignored on the CPU, with a note. None: not used.
        max_context: tokens per request at most; capped by the model's trained context
            and the pool (None: the smaller of those).
        threads: torch intra-op threads, the most (None: torch's default).
        fixed_threads: keep the thread count; by default a CPU runner uses fewer threads
            while other processes contend for the cores (``houchu.cpu.threads``).
        quantization: matmul weights: "none", "int4", "int8", "w8a8", or "auto" (int4
            for a GGUF whose projections are Q4_0/Q4_1, else none).
        quant_group_size: int4 input features per scale/zero group.
        int4_activations: what the int4 layers multiply on houchu's CPU kernels:
            "float" (the activations as they are), "int8" (quantized per 16 inputs:
            W4A8, integer dot products), or "auto" (the default: the startup measurement
            picks per batch bucket and for prefill, ``houchu.runner.autotune``; int8 is a
            candidate only where the int4 layers compute in float32, since on bf16 it
            costs the 95% top-1 agreement the quantized paths keep: 0.947 measured, against
            0.965 in float32).
        int4_method: how float weights become int4: "mse" (each group's scale and
            offset searched to minimise its rounding error), "minmax" (16 levels over
            the group's range) or "gptq" (GPTQ over calibration text at load:
            ``houchu.model.quant.gptq``). A GGUF file's Q4 tensors are kept as they are.
        calibration_text: GPTQ's calibration text file (UTF-8; None: the default text of
            ``houchu.model.quant.calibration``).
        kv_cache_dtype: "auto" (the model dtype), "int8" or "fp8".
        attention_backend: see ``houchu.runner.backends.make_backend``.
        compile: ``torch.compile`` the decode step at startup: "off", "on", or "auto"
            (kept only if a warm-up step runs faster compiled).
        decode_batch_sizes: the batch-size buckets compiled / captured, ascending.
        decode_paths: "auto" (on the CPU, time the decode paths per bucket at startup and
            keep the fastest: ``houchu.runner.autotune``) or "rules" (fixed thresholds).
        cpu_isa: level of houchu's C++ CPU kernels (``houchu.cpu.isa``): "auto",
            a level, or "generic" (torch's kernels only).
        disable_fused_layers: with the cpu backend, run decode steps op by op instead
            of one C++ call for all the layers (``houchu.cpu.fused_layers``).
        disable_cuda_graph: do not capture decode steps as CUDA graphs (CUDA only).
        deterministic: batch-invariant inference on the CPU (``houchu.runner.deterministic``):
            a request's logits do not depend on the other rows of its step or on their
            count; pins one kernel path and float activations, no compiled step, fixed
            threads.
        tensor_parallel_size: ranks the model is sharded over (``torch.distributed``:
            gloo on the CPU, NCCL on CUDA; ``houchu.runner.tensor_parallel.shards``), each with
            ``threads`` threads (default: the cores split evenly) and its own KV pool of
            ``kv_cache_mb`` holding its share of the KV heads.
        jump_forward: structured output: where a request's grammar allows only one
            continuation, append its tokens without a decode step each and feed them in
            one forward pass ("on" / "off"; ``houchu.model.grammar.jump_forward``). On by default:
            measured on the default model with ``houchu serve``'s defaults (2-core CPU),
            a JSON-schema request with long fixed keys ran 28 steps in 0.33 s instead of
            100 in 0.73 s (``houchu.bench.model.jump_forward``; the chunks as decode rows).
    """

    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    page_size: Positive | None = None
    num_pages: Positive | None = None
    kv_cache_mb: Annotated[float, Meta(gt=0)] = 1024
    mem_fraction_static: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_context: Positive | None = None
    threads: Positive | None = None
    fixed_threads: bool = False
    quantization: Literal["auto", "none", "int4", "int8", "w8a8"] = "auto"
    quant_group_size: Literal[32, 64, 128] = 32
    int4_activations: Literal["auto", "float", "int8"] = "auto"
    int4_method: Literal["mse", "minmax", "gptq"] = "mse"
    calibration_text: str | None = None
    kv_cache_dtype: Literal["auto", "int8", "fp8"] = "auto"
    attention_backend: Literal["auto", "torch", "cpu", "triton", "flash-attn"] = "auto"
    compile: Literal["auto", "on", "off"] = "auto"
    decode_batch_sizes: Annotated[tuple[Positive, ...], Meta(min_length=1)] = (1, 2, 4, 8, 16, 32)
    decode_paths: Literal["auto", "rules"] = "auto"
    cpu_isa: CpuIsa = "auto"
    disable_fused_layers: bool = False
    disable_cuda_graph: bool = False
    deterministic: bool = False
    tensor_parallel_size: Positive = 1
    jump_forward: Literal["on", "off"] = "on"

    def checked(self) -> RunnerOptions:
        """These options with their fields' bounds checked (``houchu.options.bounds``):
        what the model runner does once with the options it is given, which a caller may
        have built in Python (decoded or converted ones are checked already).

        Raises:
            msgspec.ValidationError: (a ``ValueError``) a field out of its bounds.
        """
        return checked(self)

    @property
    def kv_cache_bytes(self) -> int:
        """The KV pool budget in bytes (``kv_cache_mb`` MiB, rounded down)."""
        return int(self.kv_cache_mb * 2**20)
