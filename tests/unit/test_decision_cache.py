"""The decision cache's file: a folder in ``$HOUCHU_DECISION_CACHE`` means the file in
it, and a cache that cannot be written says so instead of failing silently."""

from __future__ import annotations

from pathlib import Path

from houchu.runner.decisions import FILE_NAME, DecisionCache


def test_a_folder_in_the_environment_holds_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOUCHU_DECISION_CACHE", str(tmp_path))
    monkeypatch.delenv("HOUCHU_NO_DECISION_CACHE", raising=False)
    cache = DecisionCache()
    assert cache.path == tmp_path / FILE_NAME
    assert cache.put("route", "k", {"b": 1}) is True
    assert DecisionCache().get("route", "k") == {"b": 1}


def test_an_unwritable_cache_warns(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("HOUCHU_NO_DECISION_CACHE", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = DecisionCache(blocker / "sub" / FILE_NAME)  # a parent that is a file
    assert cache.put("route", "k", 1) is False
    assert f"not written ({blocker} is a file, not a folder)" in capsys.readouterr().err
    assert cache.get("route", "k") is None
    cache.put("compile", "k", 2)  # said once per file: the start-up's second put is quiet
    assert capsys.readouterr().err == ""


def test_a_folder_not_made_yet_is_named_by_its_slash(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOUCHU_DECISION_CACHE", f"{tmp_path / 'new'}/")
    monkeypatch.delenv("HOUCHU_NO_DECISION_CACHE", raising=False)
    cache = DecisionCache()
    assert cache.path == tmp_path / "new" / FILE_NAME
    cache.put("route", "k", 1)
    assert (tmp_path / "new").is_dir() and DecisionCache().get("route", "k") == 1


def test_turned_off_it_neither_reads_nor_writes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOUCHU_NO_DECISION_CACHE", "1")
    cache = DecisionCache(tmp_path / FILE_NAME)
    cache.put("route", "k", 1)
    assert not (tmp_path / FILE_NAME).exists() and cache.get("route", "k") is None


def test_the_key_names_the_cpu_kernel_build_model_and_thread_budget(
    tmp_path: Path, monkeypatch
) -> None:
    """A measurement (decode paths, thread counts) is not reused by another CPU, kernel
    build, model file or thread budget."""
    import torch

    from houchu.cpu import kernels as cpu_kernels
    from houchu.runner import decisions

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    base = decisions.model_key(model, "int4")
    monkeypatch.setattr(decisions, "cpu_name", lambda: "Another CPU x64")
    assert decisions.model_key(model, "int4") != base
    monkeypatch.undo()
    monkeypatch.setattr(cpu_kernels, "current_build_key", lambda level=None: "other-build")
    assert decisions.model_key(model, "int4") != base
    monkeypatch.undo()
    other = tmp_path / "n.gguf"
    other.write_bytes(b"xy")
    assert decisions.model_key(other, "int4") != base
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert decisions.model_key(model, "int4") != base
    finally:
        torch.set_num_threads(threads)
    assert decisions.model_key(model, "int4") == base
