"""The golden prompts (chats and raw text), transformers' greedy tokens for them, and the
request body of each."""

from __future__ import annotations

from pathlib import Path

import torch

NEW_TOKENS = 32
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Explain what a CPU cache is."},
    ],
    [{"role": "user", "content": "请用中文介绍一下北京。"}],
    [{"role": "user", "content": "Describe this: 🎉🐍🚀 — what do these emoji mean?"}],
]


RAW = [
    "The quick brown fox",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
]


_REFERENCE: dict[Path, dict] = {}


def golden_reference(model_path: Path, hf_model: tuple) -> dict:
    """HF transformers greedy continuation (32 tokens, EOS not special) per prompt of
    the GGUF at ``model_path``, computed once per test process from ``hf_model``
    (tokenizer, float32 model)."""
    if model_path not in _REFERENCE:
        _REFERENCE[model_path] = _greedy_reference(*hf_model)
    return _REFERENCE[model_path]


def _greedy_reference(tok, model) -> dict:
    """``reference``'s tokens (and ``"_decode"``: the tokenizer) from transformers'
    tokenizer ``tok`` and float32 model ``model``."""
    prompts = {}
    for i, chat in enumerate(CHATS):
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        prompts[f"chat{i}"] = list(ids)
    for i, text in enumerate(RAW):
        prompts[f"raw{i}"] = tok(text)["input_ids"]
    out = {}
    with torch.inference_mode():
        for key, ids in prompts.items():
            res = model(torch.tensor([ids]), use_cache=True)
            gen = []
            for _ in range(NEW_TOKENS):
                nxt = int(res.logits[0, -1].argmax())
                gen.append(nxt)
                res = model(
                    torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True
                )
            out[key] = gen
    out["_decode"] = tok  # for text comparisons
    return out


def payload(key: str) -> dict:
    base = {"max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    if key.startswith("chat"):
        return {"messages": CHATS[int(key[4:])], **base}
    return {"prompt": RAW[int(key[3:])], **base}


KEYS = [f"chat{i}" for i in range(len(CHATS))] + [f"raw{i}" for i in range(len(RAW))]
