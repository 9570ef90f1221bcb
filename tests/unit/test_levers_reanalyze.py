"""``houchu levers --reanalyze`` (another target load, the answers stored for the
dashboard), the recommended command as copyable lines, and ``--replay-db``'s refusals,
on the sweeps of ``test_levers_resume``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from houchu.bench.sweep.reanalyze import reanalyze
from houchu.bench.sweep.records import ServerFacts, SweepResult
from houchu.bench.sweep.report import save_record
from tests.support.levers import (
    SERVE_FLAGS,
    levers_args,
    runs_in_one_go,
    start_levers_session,
    two_lever_plan,
)


def test_reanalyze_answers_at_another_target_load(tmp_path):
    """``--reanalyze FILE --target-load X``: the matrix and the recommendation at X, one
    of the record's loads; another load is refused in one line."""
    plan = two_lever_plan()
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    ctx, _, _ = start_levers_session(levers_args(tmp_path), plan)
    record = ctx.record(plan, SweepResult(runs_in_one_go(plan), facts, {}, 90.0), {}, True, 8)
    assert record["answers"]["target_load"] == 4.0  # the highest, by default
    at1 = reanalyze(json.loads(json.dumps(record)), SERVE_FLAGS, frozenset({"fp32"}), 1.0)
    answers = at1["answers"]
    assert answers["target_load"] == 1.0 and answers["recommendation"]["load"] == 1.0
    assert answers["matrix"] and all(p["load"] == 1.0 for p in answers["matrix"])
    with pytest.raises(ValueError, match="--target-load 2 is not one of the record's loads"):
        reanalyze(record, SERVE_FLAGS, frozenset({"fp32"}), 2.0)


def test_the_recommended_command_is_copied_whole():
    """The command is broken into lines with a backslash at each break (found by a
    review: rich wrapped it between a flag and its value), each flag with its value."""
    from houchu.bench.sweep.report import shell_lines

    args = ["houchu", "serve", "--model", "/a b/m.gguf", "--quantization", "int4"]
    args += ["--disable-radix-cache", *(["--kv-cache-mb", "256"] * 6), "--compile", "off"]
    text = shell_lines(args, width=40)
    lines = text.split("\n")
    assert len(lines) > 2 and all(ln.endswith(" \\") for ln in lines[:-1])
    assert all(len(ln) <= 40 + 8 for ln in lines)
    assert shlex.split(text.replace("\\\n", " ")) == args
    assert "--quantization int4" in text and "'/a b/m.gguf'" in text


def test_reanalyze_with_a_database_stores_the_answers(tmp_path, capsys):
    """``--reanalyze FILE --db URL``: a record from another machine reaches the dashboard
    (found by a review: ``--db`` was ignored); without ``--db`` nothing is stored."""
    from houchu.cli.main import main
    from houchu.storage.bench_runs import list_bench_runs
    from houchu.storage.db import open_db

    plan = two_lever_plan()
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    ctx, _, _ = start_levers_session(levers_args(tmp_path), plan)
    path = save_record(
        ctx.record(plan, SweepResult(runs_in_one_go(plan), facts, {}, 90.0), {}, True, 8),
        tmp_path / "levers.json",
    )
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    assert main(["levers", "--reanalyze", str(path)]) == 0
    assert "database: run" not in capsys.readouterr().out
    assert main(["levers", "--reanalyze", str(path), "--db", url]) == 0
    assert "database: run 1" in capsys.readouterr().out
    engine = open_db(url)
    try:
        (run,) = list_bench_runs(engine)
    finally:
        engine.dispose()
    assert run["results"]["kind"] == "lever_sweep" and run["results"]["answers"]["levers"]


def test_replay_db_refuses_a_missing_file_and_says_when_it_holds_fewer(tmp_path, capsys):
    """``--replay-db``: a mistyped sqlite path is an error (no empty database is made
    there), and a database holding fewer finished requests than ``--num-requests``
    says how many it replays (found by a review)."""
    import argparse

    from sqlalchemy.orm import Session

    from houchu.bench.prompts import PromptBuilder
    from houchu.bench.sweep.cli import _replay_from_db
    from houchu.storage.db import open_db
    from houchu.storage.models import RequestRow

    missing = tmp_path / "nonexist.db"
    args = argparse.Namespace(replay_db=f"sqlite:///{missing}", num_requests=4, seed=0)
    with pytest.raises(ValueError, match="no database at"):
        _replay_from_db(args, None, tmp_path)
    assert not missing.exists()
    url = f"sqlite:///{tmp_path / 'rec.db'}"
    engine = open_db(url)
    with Session(engine) as s:
        s.add(
            RequestRow(
                rid="r1", started_at=1.0, status="finished", prompt_tokens=12, completion_tokens=5
            )
        )
        s.commit()
    engine.dispose()
    args.replay_db = url
    path = _replay_from_db(args, PromptBuilder(), tmp_path)
    assert len(Path(path).read_text().splitlines()) == 1
    assert "holds 1 finished request(s): replaying 1, not the 4" in capsys.readouterr().err
