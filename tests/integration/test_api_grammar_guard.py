"""Grammars that kill the grammar engine's process are refused, and the process that
asked (the gateway) lives on: ``houchu.api.structured.guard`` compiles them in a child."""

from __future__ import annotations

import time

import pytest

from houchu.api.errors import ApiError
from houchu.api.structured.request import checked

pytestmark = pytest.mark.slow

#: Found by the issue 20 review: each killed the gateway (SIGSEGV in llguidance 1.9).
CRASHERS = [
    'start: %json {"const": -9223372036854775808}',
    'start: %json {"enum": [-9223372036854775807]}',
    "start: r0\n" + "\n".join(f'r{i}: r{i + 1} | "x"' for i in range(3000)) + '\nr3000: "a"',
]


@pytest.mark.parametrize("grammar", CRASHERS, ids=["json-const", "json-enum", "rule-chain"])
def test_a_grammar_that_crashes_the_engine_is_a_400(grammar: str) -> None:
    from llguidance import grammar_from

    with pytest.raises(ApiError) as e:
        checked(grammar_from("lark", grammar), "guided_grammar", "grammar")
    failure = e.value.failure
    assert failure.status == 400 and failure.code == "invalid_grammar"
    assert "crashed" in failure.message
    # the guard serves on: a good grammar compiles after the crash
    good = grammar_from("lark", 'start: "yes" | "no"')
    assert checked(good, "guided_grammar", "grammar") == good


def test_a_deep_ref_chain_is_a_400() -> None:
    from houchu.api.structured.request import json_schema_grammar

    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(3000)}
    defs["a3000"] = {"type": "integer"}
    grammar = json_schema_grammar({"$defs": defs, "$ref": "#/$defs/a0"})
    with pytest.raises(ApiError) as e:
        checked(grammar, "guided_json", "json_schema")
    assert e.value.failure.status == 400


def _rule_chain(n: int) -> str:
    return (
        "start: r0\n"
        + "\n".join(f'r{i}: r{i + 1} | "x"' for i in range(n - 1))
        + (f'\nr{n - 1}: "x"')
    )


@pytest.mark.parametrize("n", [2675, 2677])
def test_a_chain_that_overflows_the_runners_stack_is_refused(n: int) -> None:
    """Chains of 2,673-2,678 rules passed a check on an 8 MiB stack and then overflowed
    the runner's (SIGSEGV, found by the issue 20 review): the check's thread has half
    that stack, so they are refused at the gateway."""
    from llguidance import grammar_from

    with pytest.raises(ApiError) as e:
        checked(grammar_from("lark", _rule_chain(n)), "guided_grammar", "grammar")
    assert e.value.failure.status == 400


def test_a_ref_chain_that_overflows_the_runners_stack_is_refused() -> None:
    from houchu.api.structured.request import json_schema_grammar

    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(2496)}
    defs["d2496"] = {"type": "integer"}
    grammar = json_schema_grammar({"$ref": "#/$defs/d0", "$defs": defs})
    with pytest.raises(ApiError) as e:
        checked(grammar, "guided_json", "json_schema")
    assert e.value.failure.status == 400


def test_an_ordinary_deep_grammar_still_compiles() -> None:
    from llguidance import grammar_from

    grammar = grammar_from("lark", _rule_chain(200))
    assert checked(grammar, "guided_grammar", "grammar") == grammar


def test_a_crashing_grammar_sent_again_is_refused_from_its_verdict() -> None:
    """A client retrying a refused request costs no second crash (each restarts the
    child: about 3 s on 2 busy cores, during which every other check waits)."""
    from llguidance import grammar_from

    from houchu.api.structured import guard as grammar_guard

    crasher = grammar_from("lark", 'start: %json {"const": -9223372036854775808, "x": 1}')
    for _ in range(2):
        with pytest.raises(ApiError) as e:
            checked(crasher, "guided_grammar", "grammar")
        assert "crashed" in e.value.failure.message
        # the crash left no child, and the second time none was started: its verdict
        assert grammar_guard._GUARD._pool is None


def _slow_check(grammar: str) -> tuple[bool, list[str]]:
    """A check that takes long on "slow" (the guard's child runs it)."""
    if grammar == "slow":
        time.sleep(60)
    return False, []


def test_a_check_past_its_time_does_not_hold_up_the_next(monkeypatch) -> None:
    """The child still compiling a grammar past ``VALIDATE_TIMEOUT_S`` is ended: the next
    grammar is checked by a fresh child, not queued behind the slow one."""
    from houchu.api.structured import guard as grammar_guard

    monkeypatch.setattr(grammar_guard, "VALIDATE_TIMEOUT_S", 5.0)
    guard = grammar_guard._Guard(check=_slow_check)
    guard.validate("warm")  # the child started (spawned: a second or two)
    with pytest.raises(TimeoutError):
        guard.validate("slow")
    assert guard.validate("next") == (False, [])  # within 5 s, or TimeoutError


def test_a_gbnf_grammar_sent_again_is_not_converted_again(monkeypatch) -> None:
    """GBNF's conversion to Lark grows with the square of its rules (seconds for a few
    thousand): a grammar sent again reuses the converted text, and its kept verdict."""
    from houchu.api.structured import lark_rules

    calls: list[str] = []
    real = lark_rules.grammar_from

    def counting(kind: str, text: str) -> str:
        calls.append(kind)
        return real(kind, text)

    monkeypatch.setattr(lark_rules, "grammar_from", counting)
    lark_rules.ebnf_to_lark.cache_clear()
    source = 'root ::= "yes" | "no" | "maybe"'
    first = lark_rules.ebnf_to_lark(source)
    assert lark_rules.ebnf_to_lark(source) == first and calls == ["ebnf"]
    assert checked(first, "guided_grammar", "grammar") == first
