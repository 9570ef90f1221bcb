"""The GGUF tokenizer's conversion is cached: a cached load equals a fresh conversion
(encodings, chat template, special tokens), a damaged entry or an unwritable cache only
costs the conversion, and an edited file converts again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from houchu.text.tokenizer import cache as tokenizer_cache
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import ChatMessage

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello, world!",
    "<|im_start|>user\nwhat's 2+2?<|im_end|>",
    "ünïcödé 日本語 emoji 🍜 and  double  spaces\n\ttabs",
    "def f(x):\n    return x ** 2  # code",
]
CHAT = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi!")]

TOOLS = [
    {
        "type": "function",
        "function": {"name": "time", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
def gguf(tmp_path, real_model_path, monkeypatch):
    """A private copy of the default GGUF and an empty cache."""
    monkeypatch.setenv("HOUCHU_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "model" / real_model_path.name
    copy.parent.mkdir()
    shutil.copy(real_model_path, copy)
    return copy


@dataclass(frozen=True)
class Converted:
    """A GGUF copy, the cache a fresh conversion of it filled, and that conversion."""

    gguf: Path
    cache: Path
    fresh: TextTokenizer

    @property
    def folder(self) -> Path:
        """The conversion's cache entry."""
        return self.cache / "tokenizers" / tokenizer_cache.cache_key(self.gguf)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, real_model_path) -> Converted:
    """One fresh conversion of a copy of the default GGUF into an empty cache, shared by
    this module's tests: the tests that only read it (a cached load of it, its
    metadata) and those that compare another conversion to it. A conversion takes
    about 5 s of a core, so each test converts only what it checks itself. Neither the
    copy nor the cache is changed by a test (a test that changes an entry works on
    its own cache, ``own_cache``)."""
    root = tmp_path_factory.mktemp("converted")
    copy = root / "model" / real_model_path.name
    copy.parent.mkdir()
    shutil.copy(real_model_path, copy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOUCHU_CACHE", str(root / "cache"))
        fresh = load_tokenizer(copy)
    return Converted(copy, root / "cache", fresh)


@pytest.fixture
def shared_cache(converted, monkeypatch) -> Converted:
    """``converted``, its cache made the test's (``HOUCHU_CACHE``), for tests that only
    read the entry."""
    monkeypatch.setenv("HOUCHU_CACHE", str(converted.cache))
    return converted


@pytest.fixture
def own_cache(converted, tmp_path, monkeypatch) -> Converted:
    """``converted`` with a private cache (``HOUCHU_CACHE``) holding a copy of the
    conversion's entry and nothing else, for a test that changes the entry: the state
    a first load of the file leaves, without converting it again."""
    cache = tmp_path / "cache"
    shutil.copytree(converted.folder, cache / "tokenizers" / converted.folder.name)
    monkeypatch.setenv("HOUCHU_CACHE", str(cache))
    return Converted(converted.gguf, cache, converted.fresh)


def _same(a, b) -> None:
    for t in TEXTS:
        assert a.encode(t) == b.encode(t)
        assert a.decode(a.encode(t)) == b.decode(b.encode(t))
    assert a.hf_tokenizer.chat_template == b.hf_tokenizer.chat_template
    assert a.apply_chat_template(CHAT) == b.apply_chat_template(CHAT)
    assert a.apply_chat_template(CHAT, TOOLS) == b.apply_chat_template(CHAT, TOOLS)
    assert (a.add_bos, a.eos_token_ids) == (b.add_bos, b.eos_token_ids)
    assert a.hf_tokenizer.special_tokens_map == b.hf_tokenizer.special_tokens_map


def test_a_cached_load_equals_the_conversion(shared_cache):
    gguf, fresh = shared_cache.gguf, shared_cache.fresh
    folder = tokenizer_cache.tokenizer_cache_dir() / tokenizer_cache.cache_key(gguf)
    assert (folder / "tokenizer.json").is_file()
    cached = load_tokenizer(gguf)
    assert cached.hf_tokenizer.name_or_path == str(folder)  # read from the cache
    assert fresh.hf_tokenizer.name_or_path != str(folder)
    _same(fresh, cached)


def test_a_damaged_entry_converts_again(own_cache):
    gguf, fresh = own_cache.gguf, own_cache.fresh
    folder = tokenizer_cache.tokenizer_cache_dir() / tokenizer_cache.cache_key(gguf)
    (folder / "tokenizer.json").write_text("{not json")
    again = load_tokenizer(gguf)
    assert again.hf_tokenizer.name_or_path != str(folder)
    _same(fresh, again)
    repaired = load_tokenizer(gguf)  # the conversion replaced the damaged entry
    assert repaired.hf_tokenizer.name_or_path == str(folder)
    _same(fresh, repaired)


def test_an_edited_file_has_another_key(gguf):
    key = tokenizer_cache.cache_key(gguf)
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert tokenizer_cache.cache_key(gguf) != key


def test_an_unwritable_cache_still_loads(gguf, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HOUCHU_CACHE", str(blocker))
    tok = load_tokenizer(gguf)
    assert tok.encode("Hello") and not (blocker / "tokenizers").exists()


def test_a_cached_load_keeps_the_metadata_and_never_imports_torch(shared_cache):
    gguf, fresh = shared_cache.gguf, shared_cache.fresh
    folder = tokenizer_cache.tokenizer_cache_dir() / tokenizer_cache.cache_key(gguf)
    meta = json.loads((folder / tokenizer_cache.METADATA_FILE).read_text())
    assert meta["tokenizer.ggml.model"] == "gpt2" and "tokenizer.ggml.eos_token_id" in meta
    assert len(json.dumps(meta)) < 4096  # scalars only: no vocabulary, merges or types
    code = (
        "import sys; from pathlib import Path; from houchu.text.tokenizer.core import load_tokenizer; "
        f"t = load_tokenizer(Path({str(gguf)!r})); "
        "print(t.add_bos, t.eos_token_ids, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout.split()
    assert out[-1] == "False"  # read from the cache: neither torch nor the GGUF parse
    assert " ".join(out[:-1]) == f"{fresh.add_bos} {fresh.eos_token_ids}".replace(", ", ",")


def test_an_entry_without_metadata_converts_again(own_cache):
    gguf, fresh = own_cache.gguf, own_cache.fresh
    folder = tokenizer_cache.tokenizer_cache_dir() / tokenizer_cache.cache_key(gguf)
    (folder / tokenizer_cache.METADATA_FILE).unlink()  # an entry an older houchu wrote
    again = load_tokenizer(gguf)
    assert again.hf_tokenizer.name_or_path != str(folder)
    _same(fresh, again)
    assert (folder / tokenizer_cache.METADATA_FILE).is_file()  # rewritten: read next time
    assert load_tokenizer(gguf).hf_tokenizer.name_or_path == str(folder)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no leftovers


def test_old_entries_and_stale_temporaries_are_pruned(tmp_path):
    """Only the ``keep`` newest entries stay, with temporary folders younger than
    ``STALE_TMP_S``; older temporaries (a converting process died) go."""
    root = tmp_path / "tokenizers"
    now = 1_800_000_000.0
    for i in range(5):
        entry = root / f"entry{i}"
        entry.mkdir(parents=True)
        (entry / "tokenizer.json").write_text("{}")
        os.utime(entry, (now + i, now + i))
    stale, fresh_tmp = root / ".entry9.abc", root / ".entry8.def"
    stale.mkdir()
    fresh_tmp.mkdir()
    old = os.path.getmtime(fresh_tmp) - tokenizer_cache.STALE_TMP_S - 10
    os.utime(stale, (old, old))
    removed = tokenizer_cache.prune_tokenizer_cache(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == [".entry8.def", "entry3", "entry4"]
    assert sorted(p.name for p in removed) == [".entry9.abc", "entry0", "entry1", "entry2"]


def test_a_conversion_prunes_the_cache(gguf, monkeypatch):
    """Writing an entry keeps the cache at ``KEEP_TOKENIZERS`` entries, the new one in."""
    monkeypatch.setattr(tokenizer_cache, "KEEP_TOKENIZERS", 2)
    root = tokenizer_cache.tokenizer_cache_dir()
    for i in range(3):
        (root / f"old{i}").mkdir(parents=True)
        os.utime(root / f"old{i}", (1e9 + i, 1e9 + i))
    load_tokenizer(gguf)
    kept = sorted(p.name for p in root.iterdir())
    assert kept == sorted(["old2", tokenizer_cache.cache_key(gguf)]), kept
