"""Every flag of ``houchu serve --help`` reaches the configuration field it names.

Table-driven: each flag in the real help output is parsed with a value other than its
default, and the field of the same name (``--page-size`` -> ``page_size``, found
wherever it is in the configuration tree) must hold that value. A flag dropped from the
parser, a field without a flag, or a value that lands in the wrong field fails here.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from houchu.cli.main import build_parser
from houchu.cpu import isa
from houchu.options.checks import check_serve_args
from houchu.options.parser import config_from_args
from houchu.options.serve_config import Launch, ServeConfig, Timings

pytestmark = pytest.mark.slow

#: Parts of ``ServeConfig`` that no flag sets.
NOT_FLAGS = {Timings, Launch}


@functools.cache
def help_text() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "houchu.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout


def help_flags() -> list[str]:
    """The flags ``houchu serve --help`` lists (``--help`` aside)."""
    found = re.findall(r"^\s+(--[a-z0-9-]+)", help_text(), flags=re.MULTILINE)
    return [f for f in dict.fromkeys(found) if f != "--help"]


def user_fields() -> dict[str, tuple[str | None, msgspec.structs.FieldInfo]]:
    """Every field the user sets, by name: (the ``ServeConfig`` attribute of its struct,
    or None for ``ServeConfig``'s own, and the field)."""
    out: dict[str, tuple[str | None, msgspec.structs.FieldInfo]] = {}
    for f in msgspec.structs.fields(ServeConfig):
        tp = f.type
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            if tp not in NOT_FLAGS:
                for sub in msgspec.structs.fields(tp):
                    assert sub.name not in out, f"two fields named {sub.name}"
                    out[sub.name] = (f.name, sub)
        else:
            out[f.name] = (None, f)
    return out


def field_of(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def read(config: ServeConfig, attr: str | None, name: str) -> Any:
    return getattr(config if attr is None else getattr(config, attr), name)


def _plain(tp: Any) -> Any:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Annotated:  # a field's bounds
        tp = tp.__origin__
    return tp


#: Values for string fields (any string is not a valid one), and extra flags some need.
STRINGS = {
    "chat_template": "gemma",
    "host": "127.0.0.2",
    "served_model_name": "flag-name",
    "api_key": "flag-key",
    "device": "cpu",
    "kv_cache_dir": "/tmp/flag-kv",
    "db_url": "sqlite:///flag.db",
    "actor_host": "127.0.0.2",
    "router_args": "--log-level info",
}
COMPANIONS = {
    "ssd_kv_mb": ["--host-kv-mb", "1"],
    "calibration_text": ["--quantization", "int4", "--int4-method", "gptq"],
    "router_policy": ["--data-parallel-size", "2"],
    "router_args": ["--data-parallel-size", "2"],
}
#: Numbers whose default + 3 is out of range.
NUMBERS = {"mem_fraction_static": 0.5}


def a_file(folder: Path, name: str) -> str:
    """An existing file's absolute path (``--model`` and ``--draft-model`` need one)."""
    path = folder / f"{name}.gguf"
    path.touch()
    return str(path.resolve())


def non_default(name: str, info: msgspec.structs.FieldInfo, folder: Path) -> tuple[list, Any]:
    """(argv values after the flag, the value the field must then hold)."""
    default = None if info.default is msgspec.NODEFAULT else info.default
    tp = _plain(info.type)
    if name in ("model", "draft_model", "calibration_text"):
        path = a_file(folder, name)
        if name == "calibration_text":  # an empty one is refused
            Path(path).write_text("Some calibration text.\n")
        return [path], path
    if tp is bool:
        assert default is False
        return [], True
    if name == "cpu_isa":  # a level every CPU runs: the torch fallback
        return [isa.NAMES[-1]], isa.NAMES[-1]
    if typing.get_origin(tp) is Literal:
        value = next(c for c in typing.get_args(tp) if c != default)
        return [str(value)], value
    if typing.get_origin(tp) is tuple:
        return ["5,3"], (3, 5)
    if tp in (int, float):
        value = NUMBERS.get(name, (default or 0) + 3)
        return [str(value)], value
    return [STRINGS[name]], STRINGS[name]


def parse(argv: list[str]) -> ServeConfig:
    """``houchu serve ARGV`` parsed and checked as ``houchu.cli.main`` does, then the
    configuration (the model path is absolute already, so the CLI would keep it)."""
    parser = build_parser()
    args = parser.parse_args(["serve", *argv])
    check_serve_args(parser, args)
    return config_from_args(args)


def test_help_lists_a_flag_for_every_field_and_a_field_for_every_flag():
    flags = {field_of(f) for f in help_flags()}
    fields = set(user_fields())
    assert flags - fields == set(), "flags without a field"
    assert fields - flags == set(), "fields without a flag"


@pytest.mark.parametrize("flag", help_flags())
def test_flag_reaches_its_field(flag, tmp_path, monkeypatch):
    monkeypatch.delenv("HOUCHU_API_KEY", raising=False)
    name = field_of(flag)
    attr, info = user_fields()[name]
    values, want = non_default(name, info, tmp_path)
    model = [] if name == "model" else ["--model", a_file(tmp_path, "model")]
    config = parse([*model, *COMPANIONS.get(name, []), flag, *values])
    assert read(config, attr, name) == want
    default = parse(model)
    assert read(default, attr, name) != want, "the value chosen is the default"
    changed = {
        n for n, (a, _) in user_fields().items() if read(config, a, n) != read(default, a, n)
    }
    implied = {"draft_model": {"speculative"}}.get(name, set())  # --speculative draft
    companions = {field_of(f) for f in COMPANIONS.get(name, [])[::2]}
    assert changed == {name} | implied | companions, "other fields changed too"


def test_help_groups_the_flags_as_the_tree():
    """One argument group per struct: the flags under each title set the fields of one
    struct, and no struct is split across titles."""
    owner = {name: attr for name, (attr, _) in user_fields().items()}
    groups: dict[str, set[str | None]] = {}
    title = None
    for line in help_text().splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
        m = re.match(r"^\s+(--[a-z0-9-]+)", line)
        if m and m.group(1) != "--help":
            groups.setdefault(title, set()).add(owner[field_of(m.group(1))])
    assert all(len(attrs) == 1 for attrs in groups.values()), groups
    structs = [next(iter(attrs)) for attrs in groups.values()]
    assert len(structs) == len(set(structs)) == len(set(owner.values()))


def test_deterministic_takes_sglangs_spelling_too(tmp_path):
    model = ["--model", a_file(tmp_path, "model")]
    for flag in ("--deterministic", "--enable-deterministic-inference"):
        assert parse([*model, flag]).runner.deterministic is True
    assert parse(model).runner.deterministic is False


def test_deterministic_refuses_speculation(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse(["--model", a_file(tmp_path, "model"), "--deterministic", "--speculative", "ngram"])
    assert "--deterministic does not combine with --speculative" in capsys.readouterr().err


def test_a_bad_value_is_one_line_not_the_usage_block(tmp_path, capsys):
    from houchu.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(
            [
                "serve",
                "--model",
                a_file(tmp_path, "model"),
                "--deterministic",
                "--speculative",
                "ngram",
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err
    first, hint = err.strip().splitlines()
    assert first.startswith("houchu serve: error: --deterministic does not combine")
    assert "houchu serve --help" in hint


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--int4-activations", "int8"], "pins float activations"),
        (["--quantization", "w8a8"], "does not cover --quantization w8a8"),
        (["--tensor-parallel-size", "2"], "does not combine with tensor parallel"),
        (["--device", "cuda"], "runs on the CPU only"),
    ],
)
def test_deterministic_refusals_come_at_parse_time(tmp_path, capsys, flags, says):
    """Refused before any actor starts, one line, as ``--speculative`` is."""
    with pytest.raises(SystemExit):
        parse(["--model", a_file(tmp_path, "model"), "--deterministic", *flags])
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, says",
    [
        ("0", "must be in (0, 1], got 0.0"),
        ("1.5", "must be in (0, 1], got 1.5"),
        ("-0.2", "must be in (0, 1]"),
        ("nan", "must be a finite number"),
    ],
)
def test_mem_fraction_static_outside_zero_to_one_is_refused(tmp_path, capsys, value, says):
    with pytest.raises(SystemExit):
        parse(["--model", a_file(tmp_path, "model"), "--mem-fraction-static", value])
    err = capsys.readouterr().err
    assert "--mem-fraction-static" in err and says in err


def test_dtype_and_page_size_default_to_auto(tmp_path):
    """Resolved on the device by the runner (``houchu.runner.choices``)."""
    r = parse(["--model", a_file(tmp_path, "model")]).runner
    assert (r.dtype, r.page_size, r.mem_fraction_static) == ("auto", None, None)
