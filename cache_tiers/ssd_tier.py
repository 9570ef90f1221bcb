"""The SSD tier: one file per KV page under a cache directory, with a size cap.

File layout (little-endian)::

    magic    8 bytes   b"HOUCHUKV"
    version  u32       1
    hash     16 bytes  chained page hash (kvcache.page_hash)
    model    16 bytes  model + KV layout fingerprint
    payload  u64       payload length in bytes
    checksum 16 bytes  BLAKE2b-128 of the payload
    payload  ...       the page's bytes, as in the host pool slot

A file that is missing, truncated, has another fingerprint or hash, or fails its checksum
is a miss (and is deleted), never wrong output. The index is rebuilt from the directory at
start-up, so the tier survives a restart. Least recently used files go first when the cap
is reached. Blocking file I/O: the tier manager calls these methods from a thread.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path

MAGIC = b"HOUCHUKV"
SSD_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI16s16sQ16s")


class SsdTier:
    """Page files under ``directory / fingerprint.hex()``.

    Args:
        directory: the KV cache directory (created if missing).
        fingerprint: the model + KV layout fingerprint (16 bytes).
        capacity_bytes: cap on the bytes of all page files (headers included).
    """

    def __init__(self, directory: str | Path, fingerprint: bytes, capacity_bytes: int) -> None:
        self.fingerprint = fingerprint
        self.dir = Path(directory) / fingerprint.hex()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file bytes, LRU first
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0
        self.num_corrupt = 0
        self.num_writes = 0
        self.num_evictions = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self._lock = threading.Lock()
        self._scan()

    def _scan(self) -> None:
        files = sorted(self.dir.glob("*.page"), key=lambda f: f.stat().st_mtime)
        for f in files:
            try:
                h = bytes.fromhex(f.stem)
            except ValueError:
                continue
            size = f.stat().st_size
            self.index[h] = size
            self.num_bytes += size
        self._enforce_cap()

    def _path(self, h: bytes) -> Path:
        return self.dir / f"{h.hex()}.page"

    def __contains__(self, h: bytes) -> bool:
        return h in self.index

    def write(self, h: bytes, payload: bytes | memoryview) -> bool:
        """Store a page (atomically: temp file then rename). False if it cannot fit."""
        size = _HEADER.size + len(payload)
        if size > self.capacity_bytes:
            return False
        header = _HEADER.pack(
            MAGIC,
            SSD_FORMAT_VERSION,
            h,
            self.fingerprint,
            len(payload),
            hashlib.blake2b(payload, digest_size=16).digest(),
        )
        path = self._path(h)
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(payload)
        os.replace(tmp, path)
        with self._lock:
            if h in self.index:
                self.num_bytes -= self.index.pop(h)
            self.index[h] = size
            self.num_bytes += size
            self.num_writes += 1
            self.bytes_written += size
            self._enforce_cap()
        return True

    def read(self, h: bytes, out: memoryview) -> bool:
        """Read page ``h`` into ``out`` (a host slot). False on a miss or a bad file."""
        with self._lock:
            if h not in self.index:
                self.num_misses += 1
                return False
            self.index.move_to_end(h)
        path = self._path(h)
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER.size)
                payload = f.read(len(out) + 1)
        except OSError:
            return self._bad(h)
        if len(header) != _HEADER.size:
            return self._bad(h)
        magic, version, fh, fp, n, checksum = _HEADER.unpack(header)
        ok = (
            magic == MAGIC
            and version == SSD_FORMAT_VERSION
            and fh == h
            and fp == self.fingerprint
            and n == len(payload)
            and n <= len(out)
            and hashlib.blake2b(payload, digest_size=16).digest() == checksum
        )
        if not ok:
            return self._bad(h)
        out[:n] = payload
        with self._lock:
            self.num_hits += 1
            self.bytes_read += _HEADER.size + n
        return True

    def _bad(self, h: bytes) -> bool:
        with self._lock:
            self.num_corrupt += 1
            self.num_misses += 1
            if h in self.index:
                self.num_bytes -= self.index.pop(h)
        self._path(h).unlink(missing_ok=True)
        return False

    def _enforce_cap(self) -> None:
        while self.num_bytes > self.capacity_bytes and self.index:
            h, size = self.index.popitem(last=False)
            self.num_bytes -= size
            self.num_evictions += 1
            self._path(h).unlink(missing_ok=True)
