"""The tiny DeepSeek variants (MLA, MoE routings, YaRN) the family tests build, and greedy
tokens through a ModelRunner."""

from __future__ import annotations

from houchu.devtools.tiny_models import TINY_MLA
from houchu.runner.model_runner import ModelRunner
from tests.support.families import (
    runner_greedy_tokens,
)
from tests.support.runner_options import exact

MLA = TINY_MLA
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}


FAMILIES = {
    # V2: softmax routing limited to 1 of 2 expert groups
    "deepseek_v2": {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
    # V3: sigmoid routing with the correction bias, 2 of 4 groups, scaled and normalised
    "deepseek_v3": {
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "n_shared_experts": 2,
        "norm_topk_prob": True,
    },
    # V2 without the query's low-rank compression, plain top-k, YaRN RoPE, dv != dn (8 against 16)
    "deepseek_v2-yarn": {
        "q_lora_rank": None,
        "v_head_dim": 8,
        "topk_method": "greedy",
        "rope_parameters": YARN,
    },
    # V3 with rotate-half RoPE (rope_interleave false) and two dense layers first
    "deepseek_v3-halves": {
        "rope_interleave": False,
        "first_k_dense_replace": 2,
        "n_group": 2,
        "topk_group": 2,
    },
}


def runner_greedy(path, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids`` through ``ModelRunner`` (prefill, then decode)."""
    runner = ModelRunner(str(path), exact(num_pages=16, page_size=4), quiet=True)
    return runner_greedy_tokens(runner, ids, n)
