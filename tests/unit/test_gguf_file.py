"""``open_gguf``: the same fields and tensors as ``gguf.GGUFReader``, over plain views,
parsed once per unchanged file inside ``shared_gguf``."""

from __future__ import annotations

import os

import gguf
import numpy as np

from houchu.model.gguf.file import open_gguf, shared_gguf
from tests.support.gguf_files import write_small_gguf


def test_same_fields_and_tensors_as_the_library(tmp_path):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    want, got = gguf.GGUFReader(str(path)), open_gguf(path)
    assert list(got.fields) == list(want.fields)
    for key, field in want.fields.items():
        assert got.fields[key].contents() == field.contents(), key
    assert got.fields["tokenizer.ggml.tokens"].contents()[299] == "tok299"
    assert [t.name for t in got.tensors] == ["a", "b"]
    for t, u in zip(want.tensors, got.tensors, strict=True):
        assert u.tensor_type == t.tensor_type and u.shape.tolist() == t.shape.tolist()
        np.testing.assert_array_equal(u.data, t.data)
        np.testing.assert_array_equal(
            gguf.quants.dequantize(u.data, u.tensor_type),
            gguf.quants.dequantize(t.data, t.tensor_type),
        )


def test_views_are_plain_arrays_of_the_mapped_file(tmp_path):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    r = open_gguf(path)
    assert type(r.data) is np.ndarray and isinstance(r.data.base, np.memmap)
    assert type(r.tensors[0].data) is np.ndarray
    assert all(type(p) is np.ndarray for p in r.fields["tokenizer.ggml.tokens"].parts)
    assert not r.tensors[0].data.flags.writeable  # read-only map, as the library's


def test_an_unchanged_file_is_parsed_once(tmp_path):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    with shared_gguf():
        first = open_gguf(path)
        assert open_gguf(tmp_path / "." / "t.gguf") is first  # the same file, another spelling
    assert open_gguf(path) is not first
    assert open_gguf(path) is not open_gguf(path)  # outside a scope: parsed anew each time


def test_an_edited_or_replaced_file_is_opened_again(tmp_path):
    path = tmp_path / "t.gguf"
    write_small_gguf(path)
    with shared_gguf():
        first = open_gguf(path)
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # edited
        second = open_gguf(path)
        assert second is not first
        other = tmp_path / "u.gguf"
        write_small_gguf(other)
        os.replace(other, path)  # replaced: another inode
        assert open_gguf(path) is not second
        assert open_gguf(path, "c") is not open_gguf(path, "c")  # copy-on-write: never shared
