"""Unit fixtures. A unit test starts no process: the gateway's grammar check, which
runs in a child process of its own when served (``houchu.api.structured.guard``; its
crash and timeout handling: ``tests/integration/test_api_grammar_guard.py``), runs here
in the test's process, with the same check on a thread of the same stack."""

from __future__ import annotations

import pytest

from houchu.api.structured import guard as grammar_guard


class _GuardInProcess(grammar_guard._Guard):
    """The guard with its check (``_validate``) called here, not in a child process."""

    def _check(self, grammar: str) -> tuple[bool, list[str]] | str:
        return self._run(grammar)


@pytest.fixture(autouse=True)
def _grammar_check_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grammar_guard, "_GUARD", _GuardInProcess())
