"""Decode speed of the model families at one comparable size (random weights), printed:
tokens/s at batch 1 and 16 with a context past the sliding window, KV bytes per token,
active parameters per token, and what the windows saved (KV bytes not read, with the
window against without it).

    python -m houchu.devtools.bench.families [--families default,llama,qwen2,qwen3,qwen3_moe,
        deepseek_v2,deepseek_v3,mistral,gemma2,gemma3_text]
        [--context 512] [--window 128] [--steps 12] [--quantization none]

Each family is built by transformers (``from_config``) at the same widths, saved to a
temporary folder and served by a ``ModelRunner`` (CPU, float32 unless ``--dtype``). The
batch-16 row decodes 16 sequences of ``--context`` tokens each. "no window" reruns the
windowed families with their window removed from the config (the same weights), which is
what reading the whole context costs. "default" is the default model itself
(SmolLM2-135M-Instruct's GGUF, int4 as ``houchu serve`` runs it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.config.core import num_parameters
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

WIDTHS = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}


#: Qwen3-MoE at the bench's widths: 16 experts of 384, top-4 (a quarter of the dense
#: MLP's width each, so one token's experts hold the dense MLP's weights)
MOE = {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 384}
#: DeepSeek-V3 at the bench's widths: MLA (latent 256, RoPE key 32, nope/value heads 64)
#: and DeepSeekMoE (16 routed experts of 384, top-4 in 2 of 4 groups, 1 shared), layer 0 dense
DEEPSEEK = {
    "num_key_value_heads": 8,
    "kv_lora_rank": 256,
    "q_lora_rank": 384,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 384,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
}


#: DeepSeek-V2 at the bench's widths: DeepSeek-V3's MLA and experts, V2's routing
#: (group-limited greedy, softmax scores)
DEEPSEEK_V2 = DEEPSEEK | {"topk_method": "group_limited_greedy"}
#: the row of the default model itself (its own size and weights, as served: auto)
DEFAULT = "default"


def family_config(family: str, window: int) -> dict:
    """Config overrides of ``family`` at the bench's widths."""
    extra: dict = {}
    if family == "qwen3_moe":
        extra = MOE
    elif family == "deepseek_v3":
        extra = DEEPSEEK
    elif family == "deepseek_v2":
        extra = DEEPSEEK_V2
    elif family == "mistral":
        extra = {"sliding_window": window}
    elif family.startswith("gemma"):
        extra = {"sliding_window": window, "query_pre_attn_scalar": 64}
        if family == "gemma3_text":
            extra["sliding_window_pattern"] = 4
    return WIDTHS | extra


def decode_rate(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Decode tokens/s of ``batch`` sequences after a ``context``-token prefill each."""
    ps = runner.pool.page_size
    per_seq = -(-(context + steps + 1) // ps)
    greedy = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    g = torch.Generator().manual_seed(batch)
    prompts = [
        torch.randint(3, runner.config.vocab_size, (context,), generator=g).tolist()
        for _ in range(batch)
    ]
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    step = 0
    last = {}
    for i, ids in enumerate(prompts):  # prefill one sequence per step
        init = [SeqInit(rid=f"s{i}", sampling=greedy, prompt_ids=ids)]
        work = [SeqWork(rid=f"s{i}", token_ids=ids, start_pos=0, page_table=tables[i], sample=True)]
        res = runner.execute(StepPlan(step_id=step, work=work, init=init))
        last[f"s{i}"] = res.outputs[0].token_id
        step += 1
    t0 = time.perf_counter()
    for n in range(steps):
        work = [
            SeqWork(
                rid=f"s{i}",
                token_ids=[last[f"s{i}"]],
                start_pos=context + n,
                page_table=tables[i],
                sample=True,
            )
            for i in range(batch)
        ]
        res = runner.execute(StepPlan(step_id=step, work=work))
        last = {o.rid: o.token_id for o in res.outputs}
        step += 1
    took = time.perf_counter() - t0
    runner.execute(StepPlan(step_id=step, work=[], release=list(last)))
    return batch * steps / took


def model_for(family: str, window: int, tmp: Path, args: argparse.Namespace) -> tuple[str, str]:
    """(model path, quantization) of one row: ``DEFAULT`` is the default model's GGUF
    with ``auto`` (int4 for its Q4_1 projections, as ``houchu serve`` runs it); a family
    is written by transformers at the bench's widths (``window`` 0: the windowed
    families' window removed, the same weights attending everything)."""
    if family == DEFAULT:
        from houchu.model.fetch import fetch_default_model

        return str(fetch_default_model(quiet=True)), "auto"
    kw = family_config(family, window)
    if family in WINDOWED and not window:
        kw["sliding_window"] = None
    return str(make_tiny_model(tmp / f"{family}-{window}", family, seed=0, **kw)), args.quantization


#: the families run with and without their sliding window
WINDOWED = ("mistral", "gemma2", "gemma3_text")


def bench(args: argparse.Namespace) -> list[dict]:
    """One row per (family, window on/off): the measured and counted numbers."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            windowed = family in WINDOWED
            for window in (args.window, 0) if windowed else (0,):
                path, quant = model_for(family, window, Path(tmp), args)
                per_seq = -(-(args.context + args.steps + 1) // 16)
                opts = RunnerOptions(
                    device="cpu",
                    quantization=quant,
                    dtype=args.dtype,
                    compile="off",
                    decode_paths="rules",
                    page_size=16,
                    num_pages=16 * per_seq,
                    fixed_threads=True,
                )
                runner = ModelRunner(str(path), opts, quiet=True)
                cfg = runner.config
                b1 = decode_rate(runner, 1, args.context, args.steps)
                runner.window_ledger.take()
                b16 = decode_rate(runner, 16, args.context, args.steps)
                rows.append(
                    {
                        "family": family,
                        "window": window or "none",
                        "kv_bytes_per_token": runner.pool.bytes_per_token,
                        "active_params_per_token": num_parameters(cfg).matmul_per_token,
                        "decode_tok_s_b1": round(b1, 1),
                        "decode_tok_s_b16": round(b16, 1),
                        "kv_mib_not_read_b16": round(runner.window_ledger.take() / 2**20, 1),
                        "notes": runner.notes,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--families",
        default="default,llama,qwen2,qwen3,qwen3_moe,deepseek_v2,deepseek_v3,mistral,gemma2,"
        "gemma3_text",
    )
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    rows = bench(args)
    print(
        f"\n{'family':<12} {'window':>6} {'KV B/tok':>9} {'active':>10} {'b1 tok/s':>9} "
        f"{'b16 tok/s':>10} {'KV MiB not read (b16)':>22}"
    )
    for r in rows:
        print(
            f"{r['family']:<12} {r['window']!s:>6} {r['kv_bytes_per_token']:>9} "
            f"{r['active_params_per_token']:>10} {r['decode_tok_s_b1']:>9} "
            f"{r['decode_tok_s_b16']:>10} {r['kv_mib_not_read_b16']:>22}"
        )


if __name__ == "__main__":
    main()
