"""Helpers for tests elsewhere in houchu: a tiny random Llama-family model (Llama, Qwen2,
Qwen3, Qwen3-MoE, DeepSeek-V2/V3, Mistral, Gemma 2/3) saved as a Hugging Face directory,
the same model briefly trained on a text (``train_tiny_model``: peaked next-token
distributions, as a real LM's), a tokenizer to serve it with, and DeepSeek-V3's MTP
layer (needs ``transformers``; imported lazily). Their GGUF twins are written by ``houchu.devtools.gguf_writers``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


#: A tiny DeepSeek-V2/V3 (``make_tiny_model(..., "deepseek_v3", **TINY_MLA)``): MLA over
#: a 40-wide latent, DeepSeekMoE with 8 routed experts (2 per token) and a shared one,
#: the first layer dense.
TINY_MLA: dict[str, Any] = {
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "kv_lora_rank": 40,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}


def make_tiny_llama(
    path: str | Path, *, tie_word_embeddings: bool = False, seed: int = 0, **overrides: Any
) -> Path:
    """Save a randomly initialised ``LlamaForCausalLM`` (float32, safetensors) to ``path``.

    Args:
        path: target directory (created).
        tie_word_embeddings: share the embedding and LM-head matrices.
        seed: torch seed for the random weights.
        overrides: ``LlamaConfig`` fields replacing ``TINY_CONFIG``'s.
    Returns:
        ``path`` as a ``Path``.
    """
    return make_tiny_model(
        path, "llama", tie_word_embeddings=tie_word_embeddings, seed=seed, **overrides
    )


def make_tiny_model(
    path: str | Path,
    family: str,
    *,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Save a randomly initialised causal LM of ``family`` (an HF ``model_type`` houchu
    runs: "llama", "qwen2", "gemma2", "deepseek_v3", ...) through
    ``transformers.AutoModelForCausalLM.from_config`` (float32, safetensors) to ``path``. 2-D weights (and 3-D stacked experts) are drawn from N(0, 0.08²) and 1-D
    ones (norms, biases) from 1 + N(0, 0.1²) or N(0, 0.1²) (Gemma's norms, which scale by
    1 + w: N(0, 0.1²)), so that every part changes the logits visibly.

    Args:
        path: target directory (created).
        family: the HF ``model_type``.
        tie_word_embeddings: share the embedding and LM-head matrices.
        seed: torch seed for the random weights.
        overrides: config fields replacing ``TINY_CONFIG``'s.
    Returns:
        ``path`` as a ``Path``.
    """
    model = build_tiny_model(
        family, tie_word_embeddings=tie_word_embeddings, seed=seed, **overrides
    )
    out = Path(path)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_model(
    family: str, *, tie_word_embeddings: bool = False, seed: int = 0, **overrides: Any
) -> Any:
    """The float32 transformers model ``make_tiny_model`` saves (its random draw, in
    eval mode), unsaved: ``AutoModelForCausalLM.from_config`` of ``TINY_CONFIG`` with
    ``overrides``, weights drawn as ``make_tiny_model`` says. Arguments as there."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(
        family, **{**TINY_CONFIG, **overrides}, tie_word_embeddings=tie_word_embeddings
    )
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # larger-than-default weights so logits differ visibly
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and stacked experts [E, ·, ·]
                p.normal_(0.0, 0.08)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif family.startswith("gemma"):  # norms: 1 + w around 1
                p.normal_(0.0, 0.1)
            elif family != "llama":  # norms: around 1
                p.normal_(1.0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's routing bias
                b.normal_(0.0, 0.1)
    return model


class TrainedTiny(NamedTuple):
    """``train_tiny_model``'s result: ``path``, the saved folder; ``train_bpb``, the
    mean teacher-forced loss of the last 20 steps on the training text (bits per token,
    i.e. per byte for byte tokens)."""

    path: Path
    train_bpb: float


def train_tiny_model(
    path: str | Path,
    family: str,
    ids: Sequence[int],
    *,
    steps: int = 120,
    batch: int = 2,
    seq_len: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 0.01,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> TrainedTiny:
    """Train ``make_tiny_model``'s model (same config, overrides and random draw) on
    ``ids`` by teacher forcing, then save it as ``make_tiny_model`` does (float32
    safetensors and ``config.json``, so the loader and the GGUF writers take it alike).

    AdamW (decoupled ``weight_decay``, gradients clipped to norm 1) for ``steps`` steps of
    ``batch`` windows of ``seq_len + 1`` tokens drawn uniformly from ``ids``, the rate
    warmed up over 20 steps and decayed linearly to 0. Deterministic: the draw and the
    windows come from ``seed``, and the steps run on one CPU thread with
    ``torch.use_deterministic_algorithms`` (both restored afterwards), so the same
    arguments on the same CPU kind give the same weights. Costs 15-50 ms of CPU per
    step of 2 x 300 tokens at hidden size 64 (2-3 layers; the MoE and MLA models the
    most): 2-6 s for the default 120 steps.

    Args:
        path: target directory (created).
        family: the HF ``model_type``.
        ids: training token ids, each below the vocabulary size, more than ``seq_len``.
        steps: optimizer steps.
        batch: windows per step.
        seq_len: tokens per window (positions trained on).
        lr: peak learning rate.
        weight_decay: AdamW's decoupled weight decay.
        tie_word_embeddings: share the embedding and LM-head matrices.
        seed: torch seed for the random weights and the windows.
        overrides: config fields replacing ``TINY_CONFIG``'s.
    Returns:
        the saved folder and the final training loss (``TrainedTiny``).
    Raises:
        ValueError: ``ids`` not longer than ``seq_len``, an id out of the vocabulary, or
            ``steps``, ``batch`` or ``seq_len`` below 1.
    """
    import torch
    import torch.nn.functional as F

    if min(steps, batch, seq_len) < 1:
        raise ValueError(f"steps, batch and seq_len must be >= 1, got {steps}, {batch}, {seq_len}")
    if len(ids) <= seq_len:
        raise ValueError(f"need more than seq_len={seq_len} training ids, got {len(ids)}")
    model = build_tiny_model(
        family, tie_word_embeddings=tie_word_embeddings, seed=seed, **overrides
    )
    vocab = model.config.vocab_size
    data = torch.tensor(list(ids), dtype=torch.long)
    if int(data.min()) < 0 or int(data.max()) >= vocab:
        raise ValueError(
            f"training ids must be in [0, {vocab}), got {int(data.min())}..{int(data.max())}"
        )
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (1.0 - s / steps)
    )
    threads, determ = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    losses: list[float] = []
    try:
        model.train()
        for _ in range(steps):
            starts = torch.randint(0, len(data) - seq_len, (batch,), generator=gen)
            x = torch.stack([data[i : i + seq_len + 1] for i in starts.tolist()])
            logits = model(x[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(determ)
    model.eval()
    out = Path(path)
    model.save_pretrained(out, safe_serialization=True)
    tail = losses[-20:]
    return TrainedTiny(out, sum(tail) / len(tail) / math.log(2))


def write_tiny_tokenizer(path: str | Path, vocab_size: int = 128) -> Path:
    """Save a byte-level word tokenizer of ``vocab_size`` tokens beside a tiny model
    (``tokenizer.json`` and ``tokenizer_config.json``, through ``tokenizers`` and
    transformers' ``PreTrainedTokenizerFast``): ids 0, 1, 2 are ``<unk>``, ``<s>``,
    ``</s>`` and every other id one byte-level character, so any id decodes.

    Returns:
        ``path`` as a ``Path``.
    Raises:
        ValueError: ``vocab_size`` below 4 or above 259.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not 4 <= vocab_size <= 259:
        raise ValueError(f"vocab_size must be in [4, 259], got {vocab_size}")
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())[: vocab_size - 3]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {ch: i + 3 for i, ch in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            pre_tokenizers.Split(Regex("."), behavior="isolated"),  # one token per byte
        ]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(path))
    return Path(path)


def add_mtp_layer(path: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random next-token-prediction (MTP) module into the DeepSeek-V3 folder at
    ``path`` (from ``make_tiny_model``, built with the same ``overrides``), as DeepSeek's
    checkpoints store it: layer index ``N = num_hidden_layers`` with ``enorm``, ``hnorm``,
    ``eh_proj`` ``[hidden, 2·hidden]``, a full decoder block, ``shared_head.norm`` and
    ``shared_head.head`` (a copy of ``lm_head``), and ``num_nextn_predict_layers = 1`` in
    ``config.json``. transformers' ``from_config`` builds no MTP module (and its
    ``save_pretrained`` writes none), so the block is taken from a model of ``N + 1``
    layers drawn the same way, and the MTP-only tensors are drawn here: norms from
    1 + N(0, 0.1²), ``eh_proj`` from N(0, 0.08²). Returns ``path``."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    out = Path(path)
    raw = json.loads((out / "config.json").read_text())
    n = int(raw["num_hidden_layers"])
    bigger = make_tiny_model(
        out / "mtp-source", "deepseek_v3", seed=seed, **{**overrides, "num_hidden_layers": n + 1}
    )
    source = load_file(str(bigger / "model.safetensors"))
    weights = load_file(str(out / "model.safetensors"))
    p = f"model.layers.{n}."
    weights.update({k: v for k, v in source.items() if k.startswith(p)})
    gen = torch.Generator().manual_seed(seed + 1)
    h = int(raw["hidden_size"])
    for name in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"{p}{name}.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    weights[f"{p}eh_proj.weight"] = 0.08 * torch.randn(h, 2 * h, generator=gen)
    weights[f"{p}shared_head.head.weight"] = weights["lm_head.weight"].clone()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    import shutil

    shutil.rmtree(bigger)
    return out


def make_mtp_exact(path: str | Path, out: str | Path) -> Path:
    """Copy the DeepSeek-V3 folder with an MTP module at ``path`` (``add_mtp_layer``) to
    ``out`` as a model whose MTP module predicts the target's own next token: every
    block's attention output and MLP (dense, routed and shared experts) are zeroed, so
    the target's final hidden state at ``i`` is ``norm(embed(t_i))`` (a bigram model);
    the MTP module computes exactly that for the next token (``eh_proj`` = [I, 0] keeps
    the token half, ``enorm`` is 1, its zeroed block passes it through, its head norm
    is the target's final norm), so with greedy sampling every proposal is the target's
    own token. Other files (a tokenizer) are copied as they are. Returns ``out``."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(path), Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    raw = json.loads((src / "config.json").read_text())
    n, h = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    w = load_file(str(src / "model.safetensors"))
    for name, t in w.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[name] = torch.zeros_like(t)
    p = f"model.layers.{n}."
    w[f"{p}enorm.weight"] = torch.ones(h)
    w[f"{p}eh_proj.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], 1)
    w[f"{p}shared_head.norm.weight"] = w["model.norm.weight"].clone()
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
