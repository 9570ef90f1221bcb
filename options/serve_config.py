"""Serving configuration, shared by the launcher and every actor process.

``ServeConfig`` is the root of the configuration tree: the model, one options struct per
consumer (``houchu.options``: what the user sets, each field named like its ``houchu
serve`` flag), the fixed waits (``Timings``, no flag) and what the launcher fills in
before the actors start (``Launch``). It travels to each actor process as JSON
(msgspec), so it holds plain values only.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from houchu.options.batching_options import BatchingOptions
from houchu.options.cluster_options import ClusterOptions
from houchu.options.gateway_options import GatewayOptions
from houchu.options.kv_tier_options import KVTierOptions
from houchu.options.placement_options import PlacementOptions
from houchu.options.runner_options import RunnerOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.options.supervision_options import SupervisionOptions
from houchu.options.telemetry_options import TelemetryOptions
from houchu.transport.endpoints import Endpoints


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Fixed waits, in seconds (no flag; tests shorten them).

    Attributes:
        heartbeat_interval_s: between two heartbeats of an actor (``houchu.actors.runtime``).
        ready_timeout_s: an actor may take this long to start before it is killed.
        tier_lookup_timeout_s: the scheduler waits this long for a lower-tier lookup.
        draft_timeout_s: the scheduler waits this long for proposals, then steps without.
    """

    heartbeat_interval_s: float = 1.0
    ready_timeout_s: float = 600.0
    tier_lookup_timeout_s: float = 2.0
    draft_timeout_s: float = 30.0


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher fills in before the actors start (never set by the user).

    Attributes:
        endpoints: every actor's inbox address (``houchu.actors.placement``; empty until
            the launcher places the actors).
        host_pool_name: the shared memory block of the host KV tier ("": tiers off).
        host_pool_pages: pages (slots) of the host tier, from ``--host-kv-pages`` or
            ``--host-kv-mb`` (``houchu.actors.kv_tier_setup``).
        host_slot_bytes: bytes per host slot.
        kv_fingerprint: model + KV layout fingerprint, hex (names pages on the SSD tier).
    """

    endpoints: Endpoints = msgspec.field(default_factory=lambda: Endpoints({}))
    host_pool_name: str = ""
    host_pool_pages: int = 0
    host_slot_bytes: int = 0
    kv_fingerprint: str = ""


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``houchu serve`` was asked for, and where its actors live.

    Attributes:
        model: the model's .gguf file or Hugging Face folder, an absolute path (``--model``).
        chat_template: ``--chat-template``: a known template name, an absolute path to a
            Jinja file or an inline template, served instead of the model's own (None:
            the model's, else its family's built-in one; ``houchu.text.chat_templates``).
        runner, batching, speculation, kv_tiers, gateway, telemetry, supervision,
            placement, cluster: the options of each consumer (``houchu.options``).
        timings: fixed waits.
        launch: filled in by the launcher.
    """

    model: str
    chat_template: str | None = None
    runner: RunnerOptions = msgspec.field(default_factory=RunnerOptions)
    batching: BatchingOptions = msgspec.field(default_factory=BatchingOptions)
    speculation: SpeculativeOptions = msgspec.field(default_factory=SpeculativeOptions)
    kv_tiers: KVTierOptions = msgspec.field(default_factory=KVTierOptions)
    gateway: GatewayOptions = msgspec.field(default_factory=GatewayOptions)
    telemetry: TelemetryOptions = msgspec.field(default_factory=TelemetryOptions)
    supervision: SupervisionOptions = msgspec.field(default_factory=SupervisionOptions)
    placement: PlacementOptions = msgspec.field(default_factory=PlacementOptions)
    cluster: ClusterOptions = msgspec.field(default_factory=ClusterOptions)
    timings: Timings = msgspec.field(default_factory=Timings)
    launch: Launch = msgspec.field(default_factory=Launch)

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes) -> ServeConfig:
        return msgspec.json.decode(data, type=cls)

    @property
    def endpoints(self) -> Endpoints:
        """Every actor's inbox address (``launch.endpoints``)."""
        return self.launch.endpoints

    def recorder_address(self) -> str | None:
        """The recorder's inbox address, or None when telemetry is off
        (``--disable-telemetry``): what each actor's ``Telemetry`` sends to."""
        return self.launch.endpoints["recorder"] if self.telemetry.enabled else None

    def model_name(self) -> str:
        """The name clients use in the ``model`` field: ``--served-model-name``, or the
        model file or folder name without its quantization suffix."""
        if self.gateway.served_model_name:
            return self.gateway.served_model_name
        path = Path(self.model)
        stem = path.stem if path.suffix == ".gguf" else path.name
        return re.sub(r"\.(Q\d\w*|IQ\d\w*|F16|F32|BF16)$", "", stem, flags=re.IGNORECASE)

    def with_launch(self, **changes: object) -> ServeConfig:
        """This configuration with ``launch`` fields replaced (the launcher's part)."""
        return msgspec.structs.replace(self, launch=msgspec.structs.replace(self.launch, **changes))
