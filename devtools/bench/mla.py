"""MLA benchmark: a DeepSeek-V2-Lite-shaped model (random weights, fewer layers and
experts so it fits a laptop), served by ``ModelRunner`` over its latent KV pool.

    python -m houchu.devtools.bench.mla [--layers 2] [--contexts 512,2048] [--batches 1,16]
        [--dtype bfloat16] [--steps 4]

Prints, per context length and batch size: the decode step time (the fastest of
``--steps``) with the absorbed MLA
form (``W_UK`` folded into the query, ``W_UV`` after attention, attention over the
cached latents) against the naive one (every cached latent up-projected to full
per-head K/V each step), decode tokens/s for both; then the KV bytes per token against
the same model with full multi-head K/V, the tokens a 1 GiB pool holds each way, and
the active against total parameters per token (DeepSeekMoE: top-k of the routed
experts, the shared experts). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from houchu.bench.model.runner import GREEDY
from houchu.cpu.isa import isa_flags
from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.config.core import num_parameters
from houchu.model.kv.mla_pool import LatentKVPool, full_mha_bytes_per_token
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SeqInit, SeqWork, StepPlan

#: DeepSeek-V2-Lite's attention and expert widths (hidden 2048, 16 heads, kv_lora_rank
#: 512, RoPE 64, nope 128, v 128), with 16 routed experts instead of 64
LITE = {
    "vocab_size": 4096,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 16,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1408,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 4096,
}


def decode_step_s(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Seconds of the fastest of ``steps`` decode steps of ``batch`` sequences at
    ``context`` cached tokens, after one warm-up step (the pool holds random latents:
    a step's time does not depend on them)."""
    ps = runner.pool.page_size
    pages = -(-(context + steps + 1) // ps)
    tables = {f"r{i}": list(range(i * pages, (i + 1) * pages)) for i in range(batch)}
    init = [SeqInit(rid=r, sampling=GREEDY, prompt_ids=[5]) for r in tables]
    times = []
    for s in range(steps + 1):  # the first step is a warm-up
        work = [
            SeqWork(rid=r, token_ids=[7], start_pos=context + s, page_table=t, sample=True)
            for r, t in tables.items()
        ]
        t0 = time.perf_counter()
        runner.execute(StepPlan(step_id=s, work=work, init=init if s == 0 else []))
        times.append(time.perf_counter() - t0)
    runner.execute(StepPlan(step_id=steps + 1, work=[], release=list(tables)))
    return min(times[1:])  # the fastest: steps another process preempted are slower


def main() -> None:
    """Parse the flags, build the model, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_model(
            Path(tmp) / "lite", "deepseek_v2", num_hidden_layers=a.layers, **LITE
        )
        need = max(batches) * -(-(max(contexts) + a.steps + 1) // 16)
        opts = RunnerOptions(
            device="cpu",
            dtype=a.dtype,
            quantization="none",
            compile="off",
            decode_paths="rules",
            num_pages=need,
            page_size=16,
            fixed_threads=True,  # both forms at the same thread count
        )
        runner = ModelRunner(str(path), opts, quiet=True)
    cfg, pool = runner.config, runner.pool
    assert isinstance(pool, LatentKVPool)
    with torch.inference_mode():
        pool.kv.normal_()  # the cached contexts: random latents
    print(
        f"DeepSeek-V2-Lite-shaped, {cfg.num_layers} layers, {a.dtype}, "
        f"{torch.get_num_threads()} threads, CPU flags {' '.join(sorted(isa_flags())) or 'none'}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'context':>8} {'batch':>6} {'absorbed ms':>12} {'naive ms':>9} {'speed-up':>9} "
        f"{'absorbed tok/s':>15} {'naive tok/s':>12}"
    )
    for ctx in contexts:
        for b in batches:
            res = {}
            for absorb in (True, False):
                for layer in runner.model.layers:
                    layer.mla.absorb = absorb
                res[absorb] = decode_step_s(runner, b, ctx, a.steps)
            print(
                f"{ctx:>8} {b:>6} {res[True] * 1e3:>12.1f} {res[False] * 1e3:>9.1f} "
                f"{res[False] / res[True]:>8.2f}x {b / res[True]:>15.1f} {b / res[False]:>12.1f}"
            )
    elem = pool.kv.element_size()
    full = full_mha_bytes_per_token(cfg, elem)
    gib = 1 << 30
    print(
        f"KV bytes per token: {pool.bytes_per_token} (latent {cfg.mla.kv_lora_rank} + RoPE key "
        f"{cfg.mla.qk_rope_head_dim} per layer) vs {full} with full multi-head K/V "
        f"({full / pool.bytes_per_token:.1f}x); a 1 GiB pool holds "
        f"{gib // pool.bytes_per_token} tokens vs {gib // full}"
    )
    p = num_parameters(cfg)
    print(
        f"parameters: {p.total / 1e6:.0f}M total, {p.matmul_per_token / 1e6:.0f}M active per "
        f"token in matmuls ({cfg.num_experts_per_tok} of {cfg.num_experts} routed experts + "
        f"{cfg.n_shared_experts} shared per MoE layer)"
    )


if __name__ == "__main__":
    main()
