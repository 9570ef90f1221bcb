"""Serving configuration, shared by the launcher and every actor process.

It travels to each actor process as JSON (msgspec), so it holds plain values only.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from houchu.transport.endpoints import Endpoints

#: Accepted, unfinished requests the gateway holds (queued or running).
DEFAULT_MAX_QUEUED_REQUESTS = 512
#: Prompt tokens waiting in the scheduler's queue (not yet admitted to the batch).
DEFAULT_MAX_QUEUED_TOKENS = 262_144
#: Largest request body / WebSocket frame, bytes.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: Bytes a stream may leave unread in its socket's send buffer before it is aborted.
DEFAULT_STREAM_BUFFER_BYTES = 1024 * 1024


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``houchu serve`` was asked for.

    Sizes: ``kv_cache_memory_bytes`` bytes for the KV pool unless ``num_pages`` is given;
    ``page_size`` tokens per page; ``max_context`` caps the model's context window
    (tokens); ``max_batch_tokens`` tokens per step; ``chunk_size`` prefill tokens per request
    per step; ``request_timeout_s`` seconds without progress before a request fails;
    ``overlap_schedule``: plan the next step while one runs (``houchu.scheduler.overlap``):
    "on", "off", or "auto" (``scheduler.overlap.resolve_overlap``).
    Supervision (``houchu.actors.supervisor``): each actor reports a heartbeat every
    ``heartbeat_interval_s`` seconds; one silent (or busy with one step) for more than
    ``heartbeat_timeout_s`` seconds is killed and restarted, like one that died; an actor
    that dies more than ``max_restarts`` times within ``restart_window_s`` seconds stops
    the server (or, for the recorder, KV-tier manager and draft, is left off).
    Telemetry: ``db_url`` is the recorder's SQLAlchemy URL (None: SQLite at
    ``houchu.fetch.cache_dir()/houchu.db``); it keeps the newest ``retention_requests``
    requests for at most ``retention_days`` days (None: no bound of that kind).
    Speculative decoding: ``speculative`` is "ngram", "draft" (``draft_model_path``) or
    None (off); at most ``num_speculative_tokens`` proposals per request per step; off
    above ``speculative_max_batch`` decoding requests (None: the measured break-even);
    ``draft_timeout_s`` seconds to wait for proposals before stepping without them.
    Limits (``houchu.dashboard.limits``): the gateway holds at most
    ``max_queued_requests`` accepted, unfinished requests (HTTP and WebSocket; beyond it
    429 with ``Retry-After``); the scheduler's waiting queue holds at most
    ``max_queued_tokens`` prompt tokens (beyond it 429); a request body or WebSocket frame
    is at most ``max_request_bytes`` bytes (413); a stream whose client does not read is
    aborted once ``stream_buffer_bytes`` bytes wait in its socket buffer. ``api_key``:
    when set, ``Authorization: Bearer <key>`` is required on the API routes (401).
    Placement: ``actor_transport`` "ipc" (sockets in a private run directory) or "tcp"
    (ports on ``actor_host``, with CURVE keys generated at start-up).
    """

    model_path: str
    endpoints: Endpoints
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    dtype: str = "float32"
    quantization: str = "auto"  # auto | none | int4 | int8 | w8a8 (gpu.quant.resolve_quant_mode)
    quant_group_size: int = 32  # int4 input features per scale/zero group
    kv_cache_dtype: str = "auto"  # auto (model dtype) | int8 | fp8
    attention_backend: str = "auto"  # auto | torch | triton | flash-attn
    compile: str = "auto"  # torch.compile the decode step: off | auto (if faster) | on
    decode_batch_sizes: list[int] = msgspec.field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    cuda_graph: bool = True  # capture decode steps as CUDA graphs (CUDA only)
    fused_layers: bool = True  # cpu backend: one C++ call per decoder layer in decode steps
    adapt_threads: bool = True  # CPU runner: fewer threads while the cores are contended
    decode_paths: str = "auto"  # CPU decode kernel paths: auto (measured) | rules
    cpu_isa: str = "auto"  # ISA level of the C++ CPU kernels (gpu.cpu_isa): auto | a level
    page_size: int = 16
    num_pages: int | None = None
    kv_cache_memory_bytes: int = 1 << 30
    max_context: int | None = None
    max_batch_tokens: int = 512
    chunk_size: int = 512
    max_running: int = 64
    radix_cache: bool = True
    overlap_schedule: str = "auto"  # plan step N+1 while step N runs: auto | on | off
    host_kv_pages: int = 0  # host-memory KV tier, in pages (0: tiers off)
    host_kv_bytes: int = 0  # ... or in bytes (converted to pages by the launcher)
    ssd_kv_bytes: int = 0  # SSD KV tier cap, bytes (0: no SSD tier)
    kv_cache_dir: str = ""  # SSD tier directory ("" : CACHE/kv)
    kv_write_policy: str = "write_back"  # or "write_through"
    host_kv_name: str = ""  # shared memory block of the host tier (set by the launcher)
    host_slot_bytes: int = 0  # bytes per host slot (set by the launcher)
    kv_fingerprint: str = ""  # model + KV layout fingerprint, hex (set by the launcher)
    tier_lookup_timeout_s: float = 2.0
    speculative: str | None = None
    draft_model_path: str | None = None
    num_speculative_tokens: int = 4
    speculative_max_batch: int | None = None
    draft_timeout_s: float = 30.0
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 120.0
    max_restarts: int = 5
    restart_window_s: float = 60.0
    telemetry: bool = True
    db_url: str | None = None
    retention_requests: int | None = 10_000
    retention_days: float | None = 7.0
    num_threads: int | None = None
    request_timeout_s: float = 300.0
    ready_timeout_s: float = 600.0
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    max_queued_tokens: int = DEFAULT_MAX_QUEUED_TOKENS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES
    api_key: str | None = None
    actor_transport: str = "ipc"  # ipc | tcp (CURVE)
    actor_host: str = "127.0.0.1"

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes) -> ServeConfig:
        return msgspec.json.decode(data, type=cls)

    def model_name(self) -> str:
        """The name clients use in the ``model`` field: ``--served-model-name``, or the
        model file or folder name without its quantization suffix."""
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model_path)
        stem = path.stem if path.suffix == ".gguf" else path.name
        return re.sub(r"\.(Q\d\w*|IQ\d\w*|F16|F32|BF16)$", "", stem, flags=re.IGNORECASE)

    @property
    def kv_tiers(self) -> bool:
        """Whether the host (and SSD) KV tiers are on."""
        return self.host_kv_pages > 0 or self.host_kv_bytes > 0
