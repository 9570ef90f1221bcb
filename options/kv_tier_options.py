"""Options of the KV tiers below the device pool: the "KV tiers" group of ``houchu
serve``'s flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class KVTierOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The host-memory and SSD KV tiers (``houchu.actors.kv_tiers``, set up by the
    launcher: ``houchu.actors.kv_tier_setup``); each field is the ``houchu serve`` flag of
    its name.

    Attributes:
        host_kv_mb: host-memory tier, MiB (0: off unless ``host_kv_pages``).
        host_kv_pages: host-memory tier in pages (overrides ``host_kv_mb``; 0: by MiB).
        ssd_kv_mb: SSD tier cap, MiB (0: no SSD tier).
        kv_cache_dir: SSD tier directory ("": ``houchu.paths.cache_dir()/kv``).
        kv_write_policy: copy a page down when the device evicts it ("write_back") or
            as soon as it is cached ("write_through").
    """

    host_kv_mb: Annotated[int, Meta(ge=0)] = 0
    host_kv_pages: Annotated[int, Meta(ge=0)] = 0
    ssd_kv_mb: Annotated[int, Meta(ge=0)] = 0
    kv_cache_dir: str = ""
    kv_write_policy: Literal["write_back", "write_through"] = "write_back"

    @property
    def enabled(self) -> bool:
        """Whether the host (and SSD) tiers are on."""
        return self.host_kv_pages > 0 or self.host_kv_mb > 0

    @property
    def write_through(self) -> bool:
        return self.kv_write_policy == "write_through"

    @property
    def host_kv_bytes(self) -> int:
        """The host tier's size in bytes by ``host_kv_mb`` (``host_kv_pages`` wins)."""
        return self.host_kv_mb << 20

    @property
    def ssd_kv_bytes(self) -> int:
        """The SSD tier cap in bytes (0: no SSD tier)."""
        return self.ssd_kv_mb << 20
