"""Endpoint naming: where each actor's inbox lives for a given placement.

``Endpoints.ipc(run_dir)`` puts each inbox at ``ipc://RUN_DIR/NAME.sock`` (one process per
actor; the launcher's run directory is private, mode 0700); ``Endpoints.inproc(prefix)``
keeps several actors in one process (tests); ``Endpoints.tcp(host, ports, keys)`` puts
them on tcp:// ports, authenticated and encrypted with ZeroMQ CURVE (``keys``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from houchu.transport import security
from houchu.transport.security import CurveKeys

ACTORS = (
    "launcher",
    "gateway",
    "tokenizer",
    "scheduler",
    "runner",
    "recorder",
    "kv_tiers",
    "draft",
)


class Endpoints(msgspec.Struct, frozen=True):
    """Addresses of every actor's inbox, by actor name.

    ``curve``: the run's CURVE keys, required when any address is tcp://. Building or
    decoding an ``Endpoints`` registers them for its tcp:// addresses in this process, so
    ``Inbox`` / ``Outbox`` secure those sockets (``houchu.transport.security``).
    """

    addresses: dict[str, str]
    curve: CurveKeys | None = None

    def __post_init__(self) -> None:
        tcp = [a for a in self.addresses.values() if security.is_tcp(a)]
        if tcp and self.curve is None:
            raise security.InsecureTransport(
                f"tcp:// actor sockets need ZeroMQ CURVE keys: {', '.join(tcp)}"
            )
        security.register(tcp, self.curve)

    def __getitem__(self, name: str) -> str:
        return self.addresses[name]

    @classmethod
    def ipc(cls, run_dir: str | Path) -> Endpoints:
        run_dir = Path(run_dir)
        return cls({name: f"ipc://{run_dir / name}.sock" for name in ACTORS})

    @classmethod
    def inproc(cls, prefix: str) -> Endpoints:
        return cls({name: f"inproc://{prefix}-{name}" for name in ACTORS})

    @classmethod
    def tcp(cls, host: str, ports: dict[str, int], keys: CurveKeys) -> Endpoints:
        """Each actor's inbox at ``tcp://HOST:PORT`` (``ports`` by actor name, every actor
        in ``ACTORS``), secured with ``keys``. Raises KeyError for a missing port."""
        h = f"[{host}]" if ":" in host else host  # an IPv6 literal
        return cls({name: f"tcp://{h}:{ports[name]}" for name in ACTORS}, curve=keys)

    def socket_files(self) -> list[Path]:
        """The filesystem paths of ipc:// endpoints (removed at shutdown)."""
        return [Path(a[len("ipc://") :]) for a in self.addresses.values() if a.startswith("ipc://")]
