"""Quick serving benchmark: houchu through its API beside Hugging Face ``generate()``.

Starts ``houchu serve`` on the default model (or ``--model``), measures single-stream
decode tokens/s and N-concurrent output tokens/s over the WebSocket API, stops it, then
runs transformers' ``generate()`` on the same prompts (batch 1, and batch N with left
padding), and prints one table with the ratios. Run::

    python -m houchu.bench.served.quick [--model PATH] [--tokens 128] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import aiohttp

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List some facts about the Moon.",
    "Describe a day in the life of a baker.",
    "What makes a good cup of coffee?",
    "Tell me about the history of paper.",
    "How do airplanes fly?",
    "Describe the water cycle.",
]


async def _stream(url: str, prompt: str, n: int) -> tuple[int, float, float, float]:
    """One request; returns (tokens, start, first token time, last token time) in seconds."""
    msg = {
        "id": "b",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
        t0 = time.perf_counter()
        await ws.send_json(msg)
        first = last = 0.0
        while True:
            f = await ws.receive_json(timeout=600)
            now = time.perf_counter()
            if f["type"] == "error":
                raise RuntimeError(f["error"])
            if f["type"] == "delta" and not first:
                first = now
            last = now
            if f["type"] == "final":
                return f["usage"]["completion_tokens"], t0, first or now, last


async def measure_houchu(url: str, n: int, conc: int) -> dict[str, float]:
    await _stream(url, "Warm up.", 8)
    tok, t0, first, last = await _stream(url, PROMPTS[0], n)
    single = (tok - 1) / (last - first)
    t = time.perf_counter()
    res = await asyncio.gather(*(_stream(url, PROMPTS[i % len(PROMPTS)], n) for i in range(conc)))
    wall = time.perf_counter() - t
    return {
        "single_decode_tok_s": single,
        "single_ttft_s": first - t0,
        "concurrent_out_tok_s": sum(r[0] for r in res) / wall,
    }


def measure_hf(model_path: Path, n: int, conc: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(model_path.parent), model_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in PROMPTS
    ]
    kw = {
        "do_sample": False,
        "max_new_tokens": n,
        "min_new_tokens": n,
        "pad_token_id": tok.pad_token_id or 0,
    }
    with torch.inference_mode():
        one = tok([chats[0]], return_tensors="pt")
        model.generate(
            **tok(["Warm up."], return_tensors="pt"),
            **{**kw, "max_new_tokens": 8, "min_new_tokens": 8},
        )
        t = time.perf_counter()
        model.generate(**one, **kw)
        single = n / (time.perf_counter() - t)
        batch = tok([chats[i % len(chats)] for i in range(conc)], return_tensors="pt", padding=True)
        t = time.perf_counter()
        model.generate(**batch, **kw)
        conc_rate = conc * n / (time.perf_counter() - t)
    return {"single_decode_tok_s": single, "concurrent_out_tok_s": conc_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    from houchu.bench.servers import running_server
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    with running_server(model) as ws_url:
        ours = asyncio.run(measure_houchu(ws_url, args.tokens, args.concurrency))
    hf = measure_hf(Path(model), args.tokens, args.concurrency)
    rows = [
        ("single-stream decode tokens/s", "single_decode_tok_s"),
        (f"{args.concurrency}-concurrent output tokens/s", "concurrent_out_tok_s"),
    ]
    print(f"\n{'metric':<34}{'houchu':>10}{'HF generate':>13}{'ratio':>8}")
    for label, key in rows:
        print(f"{label:<34}{ours[key]:>10.1f}{hf[key]:>13.1f}{ours[key] / hf[key]:>7.2f}x")
    print(f"{'single-stream TTFT (s)':<34}{ours['single_ttft_s']:>10.3f}")
    if args.json:
        args.json.write_text(json.dumps({"houchu": ours, "hf": hf}, indent=2))


if __name__ == "__main__":
    main()
