"""Tiny DeepSeek models served by houchu against transformers: the variants, prompts, a
served generation and its check."""

from __future__ import annotations

import math
import random
from typing import Any

import aiohttp
import torch

from houchu.devtools.tiny_models import TINY_MLA

NEW = 8  # tokens generated per request
ATOL = 1e-4

MLA = {**TINY_MLA, "n_group": 2, "topk_group": 1}
FAMILIES = {
    "deepseek_v2": {"topk_method": "group_limited_greedy"},
    "deepseek_v3": {"routed_scaling_factor": 2.5, "norm_topk_prob": True},
}


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 128) for _ in range(n)]


def hf_reference(hf, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the log-softmax ``[V]`` each was drawn from."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, [lg[0].float().log_softmax(-1) for lg in out.logits]


async def generate(ws_url: str, prompt: list[int]) -> dict[str, Any]:
    """One greedy request over the WebSocket API: token ids, logprobs, usage."""
    body = {"id": "r", "prompt": prompt, "temperature": 0, "max_tokens": NEW}
    body |= {"ignore_eos": True, "logprobs": 3}
    got: dict[str, Any] = {"token_ids": [], "logprobs": [], "final": None}
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json(body)
        while got["final"] is None:
            frame = await ws.receive_json(timeout=300)
            assert frame["type"] != "error", frame
            if frame["type"] == "delta":
                got["token_ids"] += frame["token_ids"]
                got["logprobs"] += frame.get("logprobs", [])
            elif frame["type"] == "final":
                got["final"] = frame
    return got


def check(got: dict[str, Any], hf, prompt: list[int]) -> None:
    """The served tokens equal transformers'; each logprob and its top alternatives
    equal transformers' log-softmax within float32 tolerance."""
    tokens, logps = hf_reference(hf, prompt)
    assert got["token_ids"] == tokens
    for lp, ref in zip(got["logprobs"], logps, strict=True):
        assert math.isclose(lp["logprob"], float(ref[lp["token_id"]]), abs_tol=ATOL)
        for alt in lp["top_logprobs"]:
            assert math.isclose(alt["logprob"], float(ref[alt["token_id"]]), abs_tol=ATOL)
