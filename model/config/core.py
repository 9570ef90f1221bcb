"""Model configuration: the architecture numbers a Llama-family model needs, read from a
GGUF file's metadata or a Hugging Face directory's ``config.json``.

Supported: the Llama architecture (Touvron et al. 2023: RMSNorm, RoPE, grouped-query
attention, SwiGLU MLP) and the families built from the same parts with small variations,
each a flag of ``ModelConfig``:

| family | HF ``model_type`` / GGUF arch | variation |
|---|---|---|
| Llama | ``llama`` | none |
| Qwen2, Qwen2.5 (Qwen Team 2024) | ``qwen2`` | bias on the q, k and v projections |
| Qwen3 (Qwen Team 2025) | ``qwen3`` | RMSNorm over each q and k head before RoPE (QK-norm) |
| Qwen3-MoE | ``qwen3_moe`` / ``qwen3moe`` | QK-norm; top-k routed SwiGLU experts (``model.moe``) |
| DeepSeek-V2 / V3 (DeepSeek-AI 2024) | ``deepseek_v2``, ``deepseek_v3`` / ``deepseek2`` | multi-head latent attention (``mla``, ``model.mla``); DeepSeekMoE: shared experts, group-limited routing, the first k layers dense; YaRN RoPE |
| Mistral, Gemma 2, Gemma 3 | ``mistral``, ``gemma2``, ``gemma3_text`` | sliding windows, Gemma's blocks (``model.structure``) |

Anything else raises ``ModelLoadError`` here, at load time, never later as a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from houchu.model.config.structure import STRUCTURE_FAMILIES


class ModelLoadError(RuntimeError):
    """The model files are missing, malformed, or describe an unsupported architecture."""


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention's widths (DeepSeek-AI 2024, "DeepSeek-V2", §2.1).

    Attributes:
        q_lora_rank: width of the query's low-rank compression (0: a plain ``q_proj``).
        kv_lora_rank: width of the compressed KV latent ``c`` each token stores.
        qk_nope_head_dim: per-head query/key width without RoPE (up-projected from ``c``).
        qk_rope_head_dim: width of the RoPE part of the query heads and of the one key
            part all heads share (the decoupled RoPE key each token stores beside ``c``).
        v_head_dim: per-head value width.
        rope_interleave: the checkpoint lays the RoPE dimensions out in adjacent pairs
            (DeepSeek's own layout; the loader permutes them to rotate-half halves).
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and expanded key) head: nope plus RoPE parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Elements one token stores per layer: the latent ``c`` and the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder.

    Attributes:
        name: human-readable model name (from the file's metadata or directory name).
        vocab_size: rows of the embedding / LM-head matrices (tokens).
        hidden_size: model width d_model.
        intermediate_size: SwiGLU MLP inner width.
        num_layers: decoder blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA, Ainslie et al. 2023); divides num_heads.
        head_dim: width of one head (usually hidden_size // num_heads).
        rms_norm_eps: epsilon inside RMSNorm's square root.
        rope_theta: RoPE base frequency (Su et al. 2021).
        max_position: context length the model was trained for (tokens).
        tie_word_embeddings: the LM head reuses the token-embedding matrix.
        bos_token_id: beginning-of-sequence token id, if any.
        eos_token_ids: end-of-sequence token ids (possibly several).
        rope_type: "default", "linear" or "llama3" (RoPE frequency scaling).
        rope_factor: scaling factor for "linear" / "llama3".
        rope_low_freq_factor / rope_high_freq_factor / rope_original_max_position:
            Llama 3.1 frequency-smoothing parameters (only for rope_type "llama3").
        source: "gguf" or "hf".
        architecture: the family: "llama", "qwen2" or "qwen3" (see the module table).
        attention_bias: the q, k and v projections add a bias (Qwen2; Qwen3 where its
            config says so).
        qk_norm: an RMSNorm of width head_dim over each q and k head before RoPE (Qwen3).
        o_proj_bias: the attention output projection adds a bias (Qwen3 with
            ``attention_bias``).
        num_experts: routed experts of a MoE layer (0: a dense model).
        num_experts_per_tok: experts each token runs through (top-k).
        moe_intermediate_size: one expert's SwiGLU inner width.
        norm_topk_prob: renormalize the top-k router probabilities to sum to 1.
        moe_layers: indices of the layers whose MLP is the MoE (the rest are dense).
        mla: multi-head latent attention's widths (DeepSeek-V2/V3), or None. Then
            ``head_dim`` is the RoPE width (``qk_rope_head_dim``, as transformers sets it)
            and ``num_kv_heads`` equals ``num_heads``.
        n_shared_experts: DeepSeekMoE's always-active experts, run as one dense SwiGLU
            of ``n_shared_experts · moe_intermediate_size`` beside the routed ones.
        topk_method: how the routed experts are chosen: "greedy" (softmax, top-k),
            "group_limited_greedy" (DeepSeek-V2: softmax, top-k within the
            ``topk_group`` groups of highest expert score) or "noaux_tc" (DeepSeek-V3:
            sigmoid, a score-correction bias for the choice, groups by their two best).
        n_group, topk_group: the expert groups and how many of them a token may use.
        routed_scaling_factor: multiplies the routed experts' weights.
        rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim: YaRN's ramp
            bounds and attention-scale parameters (only for rope_type "yarn").
        sliding_window: tokens a sliding-window layer attends, its own included (0: none).
        sliding_layers: indices of the sliding-window layers (the rest attend everything).
        attn_scale: the attention score scale (None: 1 / sqrt(head_dim); Gemma:
            ``query_pre_attn_scalar ** -0.5``).
        attn_softcap: attention scores become ``c * tanh(s / c)`` (0: off; Gemma 2).
        final_softcap: the same on the output logits (0: off; Gemma 2).
        gemma_blocks: Gemma's block: (1 + w) RMSNorms, a norm after attention and one on
            each side of the MLP, the embedding scaled by sqrt(hidden).
        hidden_act: the gated MLP's activation, "silu" (SwiGLU) or "gelu_tanh" (GeGLU).
        rope_local_theta: the RoPE base of the sliding-window layers (0: ``rope_theta``
            for all; Gemma 3).
        mtp_layers: next-token-prediction (MTP) modules the Hugging Face config declares
            (``num_nextn_predict_layers``, DeepSeek-V3; 0 for a GGUF file, whose MTP
            tensors houchu does not read).

    The questions other code asks about the model's structure have one answer each here
    (never ``cfg.mla is not None`` or ``cfg.num_experts`` at the call site): ``is_mla``,
    ``is_moe``, ``has_sliding_window``, ``every_layer_windowed``, ``has_mtp``,
    ``plain_llama_layers`` (and ``tie_word_embeddings``, a field); ``mla_of`` gives the
    MLA widths of a model that ``is_mla``.

    Raises:
        ModelLoadError: num_heads not a multiple of num_kv_heads, odd head_dim, or an
            unsupported RoPE scaling type.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    source: str = "hf"
    architecture: str = "llama"
    attention_bias: bool = False
    qk_norm: bool = False
    o_proj_bias: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    mla: MLAConfig | None = None
    n_shared_experts: int = 0
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 0.0
    rope_mscale_all_dim: float = 0.0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    attn_scale: float | None = None
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    gemma_blocks: bool = False
    hidden_act: str = "silu"
    rope_local_theta: float = 0.0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ModelLoadError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ModelLoadError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_type not in ("default", "linear", "llama3", "yarn"):
            raise ModelLoadError(f"unsupported RoPE scaling type {self.rope_type!r}")
        if self.architecture not in ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {self.architecture!r}")
        if self.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ModelLoadError(f"unsupported MoE topk_method {self.topk_method!r}")
        if self.num_experts and self.num_experts % self.n_group:
            raise ModelLoadError(
                f"{self.num_experts} experts do not split into n_group={self.n_group} groups"
            )
        if self.sliding_window < 0 or (self.sliding_layers and not self.sliding_window):
            raise ModelLoadError(f"bad sliding window {self.sliding_window}")

    @property
    def is_mla(self) -> bool:
        """Attention is multi-head latent attention (DeepSeek-V2/V3, ``mla`` set) in every
        layer: the KV pool stores each token's latent and RoPE key
        (``houchu.model.kv.mla_pool.LatentKVPool``), not K and V per head."""
        return self.mla is not None

    @property
    def is_moe(self) -> bool:
        """Some layer's MLP is a mixture of routed experts (``moe_layers`` not empty;
        the other layers are dense). A config naming experts (``num_experts``) whose layers
        are all dense (e.g. ``first_k_dense_replace`` >= the layer count) is not MoE: no
        expert weight is loaded."""
        return bool(self.moe_layers)

    @property
    def has_sliding_window(self) -> bool:
        """Some layer attends only a sliding window (Mistral: all; Gemma 2/3: the local
        layers between global ones): ``layer_window`` is not 0 for at least one layer.
        Attention reads less; whether KV pages may be released is ``every_layer_windowed``."""
        return bool(self.sliding_window) and bool(self.sliding_layers)

    @property
    def every_layer_windowed(self) -> bool:
        """Every layer has a sliding window (Mistral; not Gemma, whose global layers
        read the whole context): KV older than the window is never read again, so its
        pages may be released."""
        return bool(self.sliding_window) and len(self.sliding_layers) == self.num_layers

    @property
    def has_mtp(self) -> bool:
        """The Hugging Face config declares MTP modules (``mtp_layers`` > 0). Their
        weights may still be missing from the safetensors:
        ``houchu.model.mtp.mtp_layer_index`` checks those before ``--speculative mtp``."""
        return self.mtp_layers > 0

    @property
    def plain_llama_layers(self) -> bool:
        """Whether every block is a plain Llama block (no projection bias, no QK-norm,
        no MoE, no MLA, no Gemma block, SwiGLU): what the fused C++ decode layers compute."""
        return not (
            self.attention_bias
            or self.qk_norm
            or self.o_proj_bias
            or self.is_moe
            or self.is_mla
            or self.gemma_blocks
            or self.hidden_act != "silu"
        )

    def layer_window(self, layer: int) -> int:
        """Tokens layer ``layer`` attends (its own included); 0: all of them."""
        return self.sliding_window if layer in self.sliding_layers else 0

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Bytes of K plus V for one token over all layers, at ``element_size`` bytes each
        (with MLA: the latent and the RoPE key, ``MLAConfig.latent_dim`` per layer)."""
        if self.is_mla:
            return self.num_layers * mla_of(self).latent_dim * element_size
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size


def mla_of(cfg: ModelConfig) -> MLAConfig:
    """The MLA widths of a model that ``is_mla`` (``cfg.mla``).

    Raises:
        ValueError: the model does not use MLA.
    """
    if cfg.mla is None:
        raise ValueError(f"{cfg.name}: not an MLA model")
    return cfg.mla


#: The families houchu runs: HF ``model_type`` / GGUF ``general.architecture`` values.
ARCHITECTURES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    *STRUCTURE_FAMILIES,
)
#: The GGUF ``general.architecture`` values houchu reads.
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "deepseek2", "gemma2", "gemma3")
#: HF ``architectures`` class names per family.
HF_CLASSES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MistralForCausalLM": "mistral",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
}


class ParamCount(NamedTuple):
    """Parameter counts (numbers of scalars, not bytes).

    ``total``: every weight. ``non_embedding``: total minus the token-embedding table and
    an untied LM head (Kaplan et al. 2020's N). ``matmul_per_token``: weights used in
    matrix multiplies for one token, LM head included (FLOPs/token ≈ 2 × this); in a MoE
    model only the ``num_experts_per_tok`` experts a token runs (and the router) count.
    """

    total: int
    non_embedding: int
    matmul_per_token: int


def num_parameters(cfg: ModelConfig) -> ParamCount:
    """Count a Llama model's parameters from its config alone (no weights needed)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_heads * d * 2 + h * cfg.num_kv_heads * d * 2  # q, o, k, v
    attn_norms = 0  # MLA's q_a and kv_a RMSNorm weights
    if cfg.is_mla:
        attn, attn_norms = _mla_params(mla_of(cfg), h, cfg.num_heads)
    dense_mlp = 3 * h * cfg.intermediate_size
    expert = 3 * h * cfg.moe_intermediate_size
    shared = cfg.n_shared_experts * expert  # DeepSeekMoE's always-active experts
    n_moe = len(cfg.moe_layers)
    # per layer on average: the MoE layers hold E experts and a router [E, hidden]
    moe_total = n_moe * (cfg.num_experts * expert + cfg.num_experts * h + shared)
    moe_active = n_moe * (cfg.num_experts_per_tok * expert + cfg.num_experts * h + shared)
    dense_layers = cfg.num_layers - n_moe
    bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * d if cfg.attention_bias else 0
    bias += h if cfg.o_proj_bias else 0
    qk_norm = 2 * d if cfg.qk_norm else 0
    norms = 4 * h if cfg.gemma_blocks else 2 * h  # RMSNorm weight vectors
    layer = attn + attn_norms + norms + bias + qk_norm
    body = cfg.num_layers * layer + dense_layers * dense_mlp + moe_total + h  # final norm
    embed = cfg.vocab_size * h
    head = 0 if cfg.tie_word_embeddings else embed
    matmul = cfg.num_layers * attn + dense_layers * dense_mlp + moe_active + embed
    return ParamCount(total=body + embed + head, non_embedding=body, matmul_per_token=matmul)


def _mla_params(m: MLAConfig, h: int, heads: int) -> tuple[int, int]:
    """``(matmul weights, norm weights)`` of one MLA attention block (scalars)."""
    if m.q_lora_rank:
        q, norms = h * m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim, m.q_lora_rank
    else:
        q, norms = h * heads * m.qk_head_dim, 0
    kv_a = h * m.latent_dim
    kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = heads * m.v_head_dim * h
    return q + kv_a + kv_b + o, norms + m.kv_lora_rank


def resolve_model_file(path: str | Path) -> Path:
    """The file or directory ``load_model_config`` actually reads (a directory holding
    exactly one ``.gguf`` and no ``config.json`` resolves to that file)."""
    p = Path(path)
    if p.is_dir() and not (p / "config.json").is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return p


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    """The decoded value of a GGUF metadata key, or ``default`` when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()
