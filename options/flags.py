"""The flag table of ``houchu serve``: every flag, the field it sets, its help.

One ``Group`` per struct of the configuration tree (``houchu.options.serve_config.ServeConfig``),
in the order ``houchu serve --help`` lists them; one ``Flag`` per field. A flag is named
like its field (``--page-size`` sets ``page_size``), and its type, choices (a
``Literal``) and default come from the field (``houchu.options.parser`` builds the
argument parser from this table). A field without a row here, or a row without a field,
fails ``tests/integration/test_serve_flags.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from houchu import env as env_vars
from houchu.options.batching_options import BatchingOptions
from houchu.options.cluster_options import ClusterOptions
from houchu.options.gateway_options import MAX_REQUEST_MB, GatewayOptions
from houchu.options.kv_tier_options import KVTierOptions
from houchu.options.placement_options import PlacementOptions
from houchu.options.runner_options import RunnerOptions
from houchu.options.serve_config import ServeConfig
from houchu.options.speculation_options import SpeculativeOptions
from houchu.options.supervision_options import SupervisionOptions
from houchu.options.telemetry_options import TelemetryOptions
from houchu.text.chat_templates import KNOWN_TEMPLATES


@dataclass(frozen=True)
class Flag:
    """One flag: ``--FIELD`` (underscores as dashes) sets ``field``.

    Attributes:
        field: the field of the group's struct.
        help: the help text ("(default: X)" is added where the default is worth showing).
        env: an environment variable read, when the parser is built, as the default.
        aliases: other spellings of the flag (another engine's name for it).
    """

    field: str
    help: str
    env: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The flag as typed: ``--page-size``."""
        return "--" + self.field.replace("_", "-")


@dataclass(frozen=True)
class Group:
    """The flags of one struct of the tree, shown as one argument group in the help.

    Attributes:
        attr: the ``ServeConfig`` attribute that holds the struct (None: the flags set
            ``ServeConfig``'s own fields).
        struct: the struct (``ServeConfig`` with ``attr`` None).
        title: the argument group's title.
        flags: one per field of the struct.
    """

    attr: str | None
    struct: type
    title: str
    flags: tuple[Flag, ...]


MODEL = Group(
    None,
    ServeConfig,
    "model",
    (
        Flag(
            "model",
            "a .gguf file or a Hugging Face model folder (default: fetch SmolLM2-135M-Instruct)",
        ),
        Flag(
            "chat_template",
            "the chat template to serve instead of the model's own: a known name "
            f"({', '.join(sorted(KNOWN_TEMPLATES))}), a Jinja file, or an inline Jinja "
            "template (default: the model's own, else its family's by architecture, as "
            "llama.cpp picks one)",
        ),
    ),
)

GATEWAY = Group(
    "gateway",
    GatewayOptions,
    "HTTP gateway (OpenAI API, WebSocket, dashboard) and its limits",
    (
        Flag("host", "address to listen on"),
        Flag("port", "HTTP and WebSocket port"),
        Flag("served_model_name", "name clients use in the `model` field"),
        Flag(
            "api_key",
            "require 'Authorization: Bearer KEY' on the API routes "
            "(default: $HOUCHU_API_KEY; prefer the variable: arguments are visible to ps)",
            env=env_vars.API_KEY,
        ),
        Flag("request_timeout", "seconds without progress before a request fails"),
        Flag(
            "max_queued_requests",
            "requests accepted and not yet finished (queued or running); beyond it "
            "HTTP 429 with Retry-After",
        ),
        Flag(
            "max_request_mb",
            f"largest request body or WebSocket frame, MiB (at most {MAX_REQUEST_MB})",
        ),
        Flag(
            "stream_buffer_kb",
            "unsent KiB a stream may leave buffered for a client that does not read "
            "before it is aborted",
        ),
        Flag(
            "tool_call_parser",
            "the model family's tool-call format, for tool_choice auto: hermes "
            "(<tool_call>...</tool_call>: Hermes, Qwen2.5/3), mistral ([TOOL_CALLS]) "
            "or llama3_json (Llama 3.1+)",
        ),
    ),
)

RUNNER = Group(
    "runner",
    RunnerOptions,
    "model runner (device, weights, KV pool, kernels, compiled step)",
    (
        Flag(
            "device",
            "where the model runs: auto (CUDA when torch sees a GPU, else the CPU), cpu, "
            "cuda or cuda:N",
        ),
        Flag(
            "dtype",
            "compute dtype of weights and KV cache (auto: bfloat16 on CUDA, float32 on the CPU)",
        ),
        Flag(
            "page_size",
            "tokens per KV page (default: 16; 256 on CUDA when --attention-backend auto "
            "picks flash-attn, whose paged KV needs a multiple of 256)",
        ),
        Flag(
            "num_pages",
            "KV pool size in pages (overrides --mem-fraction-static and --kv-cache-mb)",
        ),
        Flag("kv_cache_mb", "KV pool size in MiB"),
        Flag(
            "mem_fraction_static",
            "CUDA: fraction of the GPU's memory for the weights and the KV pool; the pool "
            "gets it less the memory in use after the weights load and an activation "
            "reserve (overrides --kv-cache-mb; ignored on the CPU, as vLLM's "
            "--gpu-memory-utilization)",
        ),
        Flag("max_context", "cap on the context window, in tokens"),
        Flag("threads", "torch threads of the model runner (the most, see below)"),
        Flag(
            "fixed_threads",
            "keep the runner's thread count; by default a CPU runner uses fewer threads "
            "while other processes contend for the cores, and probes back up when they free",
        ),
        Flag(
            "quantization",
            "matmul weights: none (dense: the exact path), int4/int8 weight-only (a GGUF's "
            "Q4_0/Q4_1 kept as int4), w8a8 (int8 weights and activations); auto: int4 for a "
            "GGUF whose projections are Q4_0/Q4_1, else none (default: %(default)s)",
        ),
        Flag("quant_group_size", "int4 input features per scale/zero group"),
        Flag(
            "int4_activations",
            "what int4 layers multiply on houchu's CPU kernels: float (the activations as "
            "they are), int8 (quantized per group of 32: integer dot products, as llama.cpp's "
            "Q4 x Q8: faster, but top-1 agreement with the exact path drops ~3 points), auto: "
            "the faster by startup measurement, per batch size (default: %(default)s)",
        ),
        Flag(
            "int4_method",
            "how float weights become int4: mse (each group's scale and offset searched "
            "for the least rounding error), minmax (16 levels over the group's range), "
            "gptq (GPTQ at load: each layer's rounding error spread over its other "
            "columns by how its inputs correlate on a calibration text; slower to load, "
            "closer to the exact path). A GGUF's Q4 tensors are kept as they are "
            "(default: %(default)s)",
        ),
        Flag(
            "calibration_text",
            "GPTQ's calibration text (a UTF-8 file; default: Python's own reference "
            "documentation, pydoc_data)",
        ),
        Flag(
            "kv_cache_dtype",
            "KV cache element type (auto: the model dtype; int8/fp8 hold ~2x the tokens)",
        ),
        Flag(
            "attention_backend",
            "attention and fused kernels (auto: on CUDA flash-attn where it imports, with "
            "256-token pages unless --page-size is set, else Triton; on the CPU, houchu's "
            "C++ kernels (cpu), built on first use, else torch)",
        ),
        Flag(
            "compile",
            "torch.compile the decode step at startup: auto keeps it only if a warm-up "
            "step runs faster compiled",
        ),
        Flag(
            "decode_batch_sizes",
            "batch-size buckets the compiled / graph-captured decode step is built for",
        ),
        Flag(
            "decode_paths",
            "CPU: auto times the fused C++ layers, houchu's GEMV, torch's packed kernels "
            "and oneDNN dense copies per decode batch bucket at startup (cached) and keeps "
            "the fastest; rules: fixed row thresholds",
        ),
        Flag(
            "cpu_isa",
            "instruction-set level of houchu's C++ CPU kernels (auto: the best this CPU "
            "runs, or $HOUCHU_CPU_ISA; generic: torch's kernels only, no C++ build)",
        ),
        Flag(
            "disable_fused_layers",
            "cpu attention backend: run decode steps op by op instead of one C++ call for "
            "all the decoder layers and the LM head",
        ),
        Flag("disable_cuda_graph", "do not capture decode steps as CUDA graphs (CUDA only)"),
        Flag(
            "deterministic",
            "batch-invariant inference (CPU): a request's logits, and so a seeded request's "
            "tokens, do not depend on what else is batched with it; pins houchu's C++ GEMV "
            "with float activations for every step, dense matmuls in fixed row tiles, no "
            "compile, fixed threads (costs speed: see docs/determinism.md)",
            aliases=("--enable-deterministic-inference",),
        ),
        Flag(
            "tensor_parallel_size",
            "shard the model over N runner processes (torch.distributed: gloo on the CPU, "
            "NCCL on CUDA, rank r on cuda:r); heads and MLP width must divide by N",
        ),
        Flag(
            "jump_forward",
            "structured output: where the grammar allows only one continuation (a JSON "
            "key, punctuation), append its tokens without a decode step each and compute "
            "them in the next step's one forward pass (SGLang's jump-forward decoding)",
        ),
    ),
)

BATCHING = Group(
    "batching",
    BatchingOptions,
    "batching (the scheduler)",
    (
        Flag("max_batch_tokens", "tokens computed per step (decodes plus prefill chunks)"),
        Flag(
            "chunked_prefill_size",
            "most prefill tokens of one request per step; 0 disables chunking",
        ),
        Flag("max_running_requests", "requests decoded together at most"),
        Flag(
            "max_queued_tokens",
            "prompt tokens waiting in the scheduler's queue; beyond it HTTP 429",
        ),
        Flag("disable_radix_cache", "do not reuse the KV of cached prompt prefixes"),
        Flag(
            "overlap_schedule",
            "plan the next step while one runs, hiding the scheduler's time (auto: on a "
            "CUDA GPU, or on a CPU with 2 or more cores beyond the runner's threads)",
        ),
    ),
)

KV_TIERS = Group(
    "kv_tiers",
    KVTierOptions,
    "KV tiers (host memory and SSD below the device pool)",
    (
        Flag("host_kv_mb", "host-memory tier, MiB (0: off)"),
        Flag("host_kv_pages", "host-memory tier in pages (overrides MiB)"),
        Flag("ssd_kv_mb", "SSD tier cap, MiB (0: off)"),
        Flag("kv_cache_dir", "SSD tier directory (default CACHE/kv)"),
        Flag(
            "kv_write_policy",
            "copy a page down when the device evicts it, or as soon as it is cached",
        ),
    ),
)

SPECULATION = Group(
    "speculation",
    SpeculativeOptions,
    "speculative decoding (a draft proposes, the model verifies)",
    (
        Flag(
            "speculative",
            "propose tokens by n-gram prompt lookup, with a draft model, or with the "
            "checkpoint's MTP layers (mtp: DeepSeek-V3's next-token prediction; default: off)",
        ),
        Flag(
            "draft_model",
            "draft model sharing the model's tokenizer (.gguf or HF folder); "
            "implies --speculative draft",
        ),
        Flag(
            "num_speculative_tokens",
            "most proposals verified per request per step (chosen adaptively below it)",
        ),
        Flag(
            "speculative_max_batch",
            "speculate only while at most N requests decode (default: the break-even "
            "batch size measured at start-up and while serving)",
        ),
    ),
)

TELEMETRY = Group(
    "telemetry",
    TelemetryOptions,
    "telemetry (the recorder and the dashboard's database)",
    (
        Flag(
            "disable_telemetry",
            "no recorder: no lifecycle events, step records or lever samples are stored",
        ),
        Flag(
            "db_url",
            "SQLAlchemy URL of the telemetry and benchmark database "
            "(default: SQLite at ~/.cache/houchu/houchu.db, or $HOUCHU_CACHE/houchu.db)",
        ),
        Flag("retention_requests", "telemetry of the newest N requests is kept; 0 keeps all"),
        Flag("retention_days", "telemetry older than this many days is pruned; 0 keeps all"),
    ),
)

SUPERVISION = Group(
    "supervision",
    SupervisionOptions,
    "supervision (actors that die or hang are restarted)",
    (
        Flag(
            "heartbeat_timeout",
            "seconds an actor's event loop may go without a heartbeat before it is "
            "killed and restarted (a model step runs on a worker thread, so a long step is "
            "busy, not silent)",
        ),
        Flag(
            "max_restarts",
            "restarts of one actor allowed within --restart-window; one more death stops "
            "the server (the recorder, KV-tier manager and draft are then left off instead)",
        ),
        Flag("restart_window", "seconds of --max-restarts"),
    ),
)

PLACEMENT = Group(
    "placement",
    PlacementOptions,
    "actor placement",
    (
        Flag(
            "actor_transport",
            "actor sockets: ipc in a private directory, or tcp with ZeroMQ CURVE keys",
        ),
        Flag("actor_host", "address of tcp actor sockets"),
    ),
)

CLUSTER = Group(
    "cluster",
    ClusterOptions,
    "data parallel (engine replicas behind SGLang's Model Gateway, smg: pip install houchu[cluster])",
    (
        Flag(
            "data_parallel_size",
            "engine replicas on this machine, each with its share of the cores (--threads "
            "split) or its own GPU, behind smg on --port; replica i serves on port+1+i",
        ),
        Flag("router_policy", "smg's load-balancing policy (smg launch --policy)"),
        Flag(
            "router_args",
            "more smg launch flags, one shell-quoted string (e.g. a lower balance "
            "threshold); a flag given here wins over houchu's choice of it",
        ),
    ),
)

#: The whole table, in the order of the help.
GROUPS: tuple[Group, ...] = (
    MODEL,
    GATEWAY,
    RUNNER,
    BATCHING,
    KV_TIERS,
    SPECULATION,
    TELEMETRY,
    SUPERVISION,
    PLACEMENT,
    CLUSTER,
)
