"""A GGUF file's header kept as a small index, so that a model runner's later starts
read the file's configuration and tensor table without parsing it again.

``gguf.GGUFReader`` parses every metadata value of the file, the tokenizer's
vocabulary and merges included (some 100,000 strings in SmolLM2-135M's GGUF, 150,000
field parts): 1.5 s of a core on a 2-core AMD EPYC with AVX-512, 2.2 s on an AVX2-only
one, at every start of every model runner. A runner wants none of those arrays: it
reads the configuration's scalars and the table of tensors (name, type, shape, where
the data is). ``open_gguf_index`` keeps just that, as JSON under
``$HOUCHU_CACHE/gguf-index/``, keyed by the file's identity (resolved path, device,
inode, size, modification time) and the ``gguf`` package's version. The first open
parses the file with ``gguf.GGUFReader`` (``gguf_file.open_gguf``) and writes the
index; later ones read it (a few milliseconds) and view the tensors' data in the
memory-mapped file exactly as ``gguf.GGUFReader`` does (same dtype, shape and bytes).

Metadata arrays of more than ``MAX_INDEXED_ARRAY`` elements are left out of the
index; asking for one parses the file then (``IndexFields.get``), so a caller gets
what the library would have given it, only later.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from houchu.paths import cache_dir

INDEX_VERSION = 1
MAX_INDEXED_ARRAY = 4096  # elements; the tokenizer's vocabulary and merges are longer
KEEP_INDEXES = 64  # the most recently written indexes kept (files come and go: tests)


@dataclass(frozen=True)
class IndexedField:
    """A metadata value read from the index; ``contents()`` as ``gguf.ReaderField``'s."""

    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class IndexedTensor:
    """A tensor of the file, as ``gguf.ReaderTensor`` gives it.

    Attributes:
        name: GGUF tensor name.
        tensor_type: its ``gguf.GGMLQuantizationType``.
        shape: ``[n_dims]`` uint64, GGUF's order (fastest dimension first).
        data_offset: where its data starts in the file (bytes).
        n_bytes: its data's size (bytes).
        data: a plain ``np.ndarray`` view of the memory-mapped file: ``[rows, bytes per
            row]`` uint8 for a quantized type, else the elements in PyTorch order.
    """

    name: str
    tensor_type: Any
    shape: np.ndarray
    data_offset: int
    n_bytes: int
    data: np.ndarray


class IndexFields(Mapping):
    """The file's metadata by key: the indexed values, and for a key left out of the
    index (a long array) the library's field, from a parse made when first asked."""

    def __init__(self, path: Path, values: dict[str, Any], left_out: list[str]) -> None:
        self._path = path
        self._values = values
        self._left_out = left_out

    def __getitem__(self, key: str) -> Any:
        if key in self._values:
            return IndexedField(self._values[key])
        if key in self._left_out:
            from houchu.model.gguf.file import open_gguf

            return open_gguf(self._path).fields[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from self._values
        yield from self._left_out

    def __len__(self) -> int:
        return len(self._values) + len(self._left_out)


class GgufIndex:
    """A read-only stand-in for ``gguf.GGUFReader`` built from an index: ``fields``
    (``IndexFields``) and ``tensors`` (``IndexedTensor``s, in the file's order)."""

    def __init__(self, path: Path, entry: dict[str, Any]) -> None:
        import gguf

        self.path = path
        self.fields = IndexFields(path, entry["fields"], entry["left_out"])
        mapped = np.memmap(path, mode="r").view(np.ndarray)  # uint8 [file bytes]
        self.tensors = []
        for t in entry["tensors"]:
            off, n = t["offset"], t["n_bytes"]
            data = mapped[off : off + n].view(np.dtype(t["dtype"])).reshape(t["data_shape"])
            shape = np.array(t["shape"], dtype=np.uint64)
            qtype = gguf.GGMLQuantizationType(t["type"])
            self.tensors.append(IndexedTensor(t["name"], qtype, shape, off, n, data))


def index_dir() -> Path:
    """Where the indexes are kept: ``$HOUCHU_CACHE/gguf-index``."""
    return cache_dir() / "gguf-index"


def _identity(path: Path) -> list:
    from importlib.metadata import version

    st = path.stat()
    ident = [str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
    return [INDEX_VERSION, version("gguf"), *ident]


def open_gguf_index(path: str | Path) -> Any:
    """``gguf.GGUFReader``'s fields and tensors of ``path``: from its index where one is
    kept for the unchanged file (a ``GgufIndex``), else from a parse of the file
    (``gguf_file.open_gguf``, shared inside ``shared_gguf``), whose index is then
    written for the next open. An unreadable or damaged index is written anew; one
    that cannot be written only costs the next open a parse.

    Raises:
        What ``gguf.GGUFReader`` raises on a missing or malformed file (``OSError``,
        ``ValueError``, ...).
    """
    from houchu.model.gguf.file import open_gguf

    p = Path(path).resolve()
    ident = _identity(p)
    file = index_dir() / (hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32] + ".json")
    try:
        entry = json.loads(file.read_text())
        if entry.get("identity") == ident:
            return GgufIndex(p, entry)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no index yet, or a damaged one: parse and write it
    reader = open_gguf(p)
    try:
        _write(file, {"identity": ident, **_entry(reader)})
    except (OSError, TypeError, ValueError):
        pass  # a read-only cache: the next open parses again
    return reader


def _entry(reader: Any) -> dict[str, Any]:
    """The index of an open ``gguf.GGUFReader``: its short fields' contents, the keys of
    the long ones, and its tensor table."""
    fields: dict[str, Any] = {}
    left_out: list[str] = []
    for key, f in reader.fields.items():
        if len(f.types) > 1 and len(f.data) > MAX_INDEXED_ARRAY:  # an array field
            left_out.append(key)
            continue
        value = f.contents()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            left_out.append(key)
            continue
        fields[key] = value
    tensors = [
        {
            "name": t.name,
            "type": int(t.tensor_type),
            "shape": [int(d) for d in t.shape.tolist()],
            "offset": int(t.data_offset),
            "n_bytes": int(t.data.nbytes),
            "dtype": t.data.dtype.str,
            "data_shape": list(t.data.shape),
        }
        for t in reader.tensors
    ]
    return {"fields": fields, "left_out": left_out, "tensors": tensors}


def _write(file: Path, entry: dict[str, Any]) -> None:
    """Write ``entry`` to ``file`` atomically (a temporary file, then a rename)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _prune(file.parent, KEEP_INDEXES)


def _prune(folder: Path, keep: int) -> None:
    """Remove all but the ``keep`` most recently written indexes of ``folder``."""
    found = []
    for f in folder.glob("*.json"):
        try:
            found.append((f.stat().st_mtime_ns, f))
        except OSError:
            continue  # removed by another process meanwhile
    for _, f in sorted(found, reverse=True)[keep:]:
        f.unlink(missing_ok=True)
