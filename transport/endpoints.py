"""Endpoint naming: where each actor's inbox lives for a given placement.

``Endpoints.ipc(run_dir)`` puts each inbox at ``ipc://RUN_DIR/NAME.sock`` (one process per
actor); ``Endpoints.inproc(prefix)`` keeps several actors in one process (tests).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

ACTORS = ("launcher", "gateway", "tokenizer", "scheduler", "runner", "recorder", "kv_tiers", "draft")


class Endpoints(msgspec.Struct, frozen=True):
    """Addresses of every actor's inbox, by actor name."""

    addresses: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.addresses[name]

    @classmethod
    def ipc(cls, run_dir: str | Path) -> Endpoints:
        run_dir = Path(run_dir)
        return cls({name: f"ipc://{run_dir / name}.sock" for name in ACTORS})

    @classmethod
    def inproc(cls, prefix: str) -> Endpoints:
        return cls({name: f"inproc://{prefix}-{name}" for name in ACTORS})

    def socket_files(self) -> list[Path]:
        """The filesystem paths of ipc:// endpoints (removed at shutdown)."""
        return [Path(a[len("ipc://") :]) for a in self.addresses.values() if a.startswith("ipc://")]
