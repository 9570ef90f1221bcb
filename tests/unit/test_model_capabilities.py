"""The model's capability answers (``ModelConfig.is_mla``, ``is_moe``,
``has_sliding_window``, ``every_layer_windowed``, ``has_mtp``, ``plain_llama_layers``) for
a tiny ``config.json`` of each family, read as the runner reads it (no weights: only the
config is parsed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from houchu.devtools.tiny_models import TINY_CONFIG, TINY_MLA
from houchu.model.config.core import ModelConfig, mla_of
from houchu.model.config.hf import config_from_hf

_GEMMA = {
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 16,
}
_QWEN3_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "mlp_only_layers": [0],
}

#: HF ``model_type`` and the ``config.json`` fields beside ``TINY_CONFIG``'s, per case
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "mistral": ("mistral", {"sliding_window": 16}),
    "mistral-no-window": ("mistral", {"sliding_window": None}),
    "gemma2": ("gemma2", {**_GEMMA, "attn_logit_softcapping": 50.0}),
    "gemma3": ("gemma3_text", {**_GEMMA, "num_hidden_layers": 6, "rope_local_base_freq": 1e4}),
    "qwen3_moe": ("qwen3_moe", {**_QWEN3_MOE, "head_dim": 16}),
    "deepseek_v2": ("deepseek_v2", TINY_MLA),
    "deepseek_v3-mtp": ("deepseek_v3", {**TINY_MLA, "num_nextn_predict_layers": 1}),
    "deepseek_v2-dense": ("deepseek_v2", {**TINY_MLA, "n_routed_experts": None}),
    # experts named, every layer dense: not MoE (no expert weight is loaded)
    "deepseek_v2-all-dense": ("deepseek_v2", {**TINY_MLA, "first_k_dense_replace": 3}),
}


class Want(NamedTuple):
    is_mla: bool
    is_moe: bool
    has_sliding_window: bool
    every_layer_windowed: bool
    has_mtp: bool
    plain_llama_layers: bool
    tie_word_embeddings: bool


EXPECTED = {
    "llama": Want(False, False, False, False, False, True, False),
    "llama-tied": Want(False, False, False, False, False, True, True),
    "qwen3": Want(False, False, False, False, False, False, False),
    "mistral": Want(False, False, True, True, False, True, False),
    "mistral-no-window": Want(False, False, False, False, False, True, False),
    "gemma2": Want(False, False, True, False, False, False, True),
    "gemma3": Want(False, False, True, False, False, False, True),
    "qwen3_moe": Want(False, True, False, False, False, False, False),
    "deepseek_v2": Want(True, True, False, False, False, False, False),
    "deepseek_v3-mtp": Want(True, True, False, False, True, False, False),
    "deepseek_v2-dense": Want(True, False, False, False, False, False, False),
    "deepseek_v2-all-dense": Want(True, False, False, False, False, False, False),
}


def _config(tmp_path: Path, case: str) -> ModelConfig:
    family, fields = CASES[case]
    raw = {**TINY_CONFIG, "model_type": family, **fields}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return config_from_hf(tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_family_answers(tmp_path: Path, case: str) -> None:
    cfg = _config(tmp_path, case)
    got = Want(*(getattr(cfg, name) for name in Want._fields))
    assert got == EXPECTED[case]


def test_the_window_answers_follow_the_layers(tmp_path: Path) -> None:
    """Mistral windows every layer; Gemma 2 alternates local and global layers (the
    windowed answer is "some layer", page release needs "every layer"); Gemma 3 has one
    global layer in six."""
    mistral = _config(tmp_path, "mistral")
    assert [mistral.layer_window(i) for i in range(mistral.num_layers)] == [16, 16]
    gemma2 = _config(tmp_path, "gemma2")
    assert [gemma2.layer_window(i) for i in range(gemma2.num_layers)] == [16, 0]
    gemma3 = _config(tmp_path, "gemma3")
    assert [gemma3.layer_window(i) for i in range(gemma3.num_layers)] == [16] * 5 + [0]
    # a window with no layer using it is no window at all
    unused = dataclasses.replace(gemma2, sliding_layers=())
    assert not unused.has_sliding_window and not unused.every_layer_windowed


def test_moe_is_about_layers_not_expert_counts(tmp_path: Path) -> None:
    qwen = _config(tmp_path, "qwen3_moe")
    assert qwen.moe_layers == (1,) and qwen.num_experts == 8
    dense = _config(tmp_path, "deepseek_v2-all-dense")
    assert dense.num_experts == 8 and dense.moe_layers == () and not dense.is_moe


def test_mla_widths_only_for_mla_models(tmp_path: Path) -> None:
    ds = _config(tmp_path, "deepseek_v2")
    m = mla_of(ds)
    assert m.kv_lora_rank == TINY_MLA["kv_lora_rank"]
    assert ds.kv_bytes_per_token(2) == ds.num_layers * m.latent_dim * 2
    llama = _config(tmp_path, "llama")
    with pytest.raises(ValueError, match="not an MLA model"):
        mla_of(llama)
    assert llama.kv_bytes_per_token(2) == 2 * 2 * llama.num_kv_heads * llama.head_dim * 2
