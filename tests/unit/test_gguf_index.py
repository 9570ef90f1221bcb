"""``open_gguf_index``: a later open reads the kept index instead of parsing the file, and
gives the library's fields and tensors; long arrays are parsed when asked for; an
edited file, a damaged index or a read-only cache never give stale or wrong values."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from houchu.model.gguf import index as gguf_index
from houchu.model.gguf.index import GgufIndex, index_dir, open_gguf_index
from tests.support.gguf_files import write_small_gguf


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOUCHU_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_index, "MAX_INDEXED_ARRAY", 100)  # the 300-token list is long


def _same_as_library(got, path) -> None:
    want = gguf.GGUFReader(str(path))
    assert sorted(got.fields) == sorted(want.fields)
    for key, field in want.fields.items():
        assert got.fields[key].contents() == field.contents(), key
        assert got.fields.get(key).contents() == field.contents(), key
    assert got.fields.get("no.such.key") is None
    assert [t.name for t in got.tensors] == [t.name for t in want.tensors]
    for t, u in zip(want.tensors, got.tensors, strict=True):
        assert u.tensor_type == t.tensor_type and u.shape.tolist() == t.shape.tolist()
        assert u.data.dtype == t.data.dtype and u.data.shape == t.data.shape
        np.testing.assert_array_equal(u.data, t.data)


def test_a_later_open_reads_the_index_and_equals_the_library(tmp_path, monkeypatch):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    first = open_gguf_index(path)
    assert not isinstance(first, GgufIndex)  # parsed, and the index written
    assert len(list(index_dir().glob("*.json"))) == 1

    parsed = []
    real = gguf.GGUFReader.__init__

    def counting(self, *a, **kw):
        parsed.append(a)
        real(self, *a, **kw)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counting)
    again = open_gguf_index(path)
    assert isinstance(again, GgufIndex)
    assert again.fields["general.name"].contents() == "tiny"
    assert [t.name for t in again.tensors] == ["a", "b"] and not parsed  # no parse
    assert type(again.tensors[0].data) is np.ndarray and not again.tensors[0].data.flags.writeable
    assert again.fields["tokenizer.ggml.tokens"].contents()[299] == "tok299"  # left out: parsed
    assert len(parsed) == 1
    _same_as_library(again, path)


def test_an_edited_file_is_indexed_anew(tmp_path):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    open_gguf_index(path)
    w = gguf.GGUFWriter(str(path), "llama")  # another file at the same path
    w.add_uint32("llama.block_count", 7)
    w.add_tensor("c", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    got = open_gguf_index(path)
    assert got.fields["llama.block_count"].contents() == 7
    assert [t.name for t in got.tensors] == ["c"]
    again = open_gguf_index(path)
    assert isinstance(again, GgufIndex)
    np.testing.assert_array_equal(again.tensors[0].data, np.arange(8).reshape(2, 4))


@pytest.mark.parametrize("damage", ["", "{not json", '{"identity": 1}', '{"tensors": []}'])
def test_a_damaged_index_is_written_anew(tmp_path, damage):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    open_gguf_index(path)
    (index,) = index_dir().glob("*.json")
    index.write_text(damage)
    got = open_gguf_index(path)  # parsed again, and the index repaired
    _same_as_library(got, path)
    assert isinstance(open_gguf_index(path), GgufIndex)


def test_an_unwritable_cache_only_costs_a_parse(tmp_path, monkeypatch):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HOUCHU_CACHE", str(blocker))
    got = open_gguf_index(path)
    assert not isinstance(got, GgufIndex)
    _same_as_library(got, path)


def test_only_the_most_recent_indexes_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_index, "KEEP_INDEXES", 3)
    for i in range(5):
        path = tmp_path / f"t{i}.gguf"
        write_small_gguf(path)
        open_gguf_index(path)
    assert len(list(index_dir().glob("*.json"))) == 3
    assert isinstance(open_gguf_index(tmp_path / "t4.gguf"), GgufIndex)
