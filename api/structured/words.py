"""A structured-output constraint's 400, in words a user understands.

The grammar engine is llguidance (``houchu.api.structured.request``). Its compile errors name
its internals: a regex anchor in the middle of a pattern is "lookarounds not supported
yet; Start in regex /a^/", a JSON schema that no value satisfies is "Unsatisfiable
schema: schema is false". ``describe`` says what they mean for the request; any other
error is given as llguidance words it. ``endless`` words the refusal of a grammar with
rules that never finish (``houchu.api.structured.lark_rules``).
"""

from __future__ import annotations

import re

#: llguidance's refusal of a regex assertion: the assertion's kind and the regex.
_LOOK = re.compile(
    r"lookarounds not supported yet; (?P<look>\w+) in regex /(?P<regex>.*)/\s*$", re.M
)
#: llguidance's refusal of a JSON schema no value satisfies, and where it found it.
_UNSAT = re.compile(
    r"Unsatisfiable schema: (?P<why>[^\n]*)(?:\n\s*while processing \S*?#(?P<at>\S*))?"
)
#: Why a schema matches nothing, for llguidance's reasons that are not self-explaining.
_UNSAT_WORDS = {
    "schema is false": 'it requires a part that allows no value ({"not": {}} or false)',
    "anyOf is empty": "an empty list (anyOf, enum or type) leaves no value to choose",
    "incompatible types": "its parts ask for types no value has at once",
}


def describe(param: str, what: str, message: str) -> str:
    """The 400's message for llguidance's compile ``message`` of the constraint given
    by ``param`` (``what``: its form, e.g. "regular expression")."""
    first = message.strip()
    unsat = _UNSAT.search(first)
    if unsat is not None:
        why = _UNSAT_WORDS.get(unsat.group("why"), unsat.group("why"))
        at = f" (at #{unsat.group('at')})" if unsat.group("at") else ""
        return f"'{param}' matches no JSON value, so no output could satisfy it: {why}{at}"
    look = _LOOK.search(first)
    if look is not None:
        first = _look_words(look.group("look"), look.group("regex"))
    return f"'{param}' is not a valid {what}: {first}"


def _look_words(look: str, regex: str) -> str:
    """Why the assertion ``look`` (regex-syntax's name of it) in ``/regex/`` is refused."""
    engine = "the grammar engine (llguidance)"
    if look in ("Start", "End"):
        anchor, edge, other, where = (
            ("'^'", "start", "'$' only at its end", "after text")
            if look == "Start"
            else ("'$'", "end", "'^' only at its start", "before more text")
        )
        return (
            f"the anchor {anchor} in the middle of /{regex}/ is not supported: {engine} "
            f"always matches the whole output, so it takes {anchor} only at the {edge} of "
            f"the pattern ({other}), where it is not needed; {where}, {anchor} could "
            "never match. Remove the anchor"
        )
    if look.startswith(("StartLF", "EndLF", "StartCRLF", "EndCRLF")):
        return (
            f"line anchors ('^' and '$' in multi-line mode, (?m)) in /{regex}/ are not "
            f"supported by {engine}; match the line breaks (\\n) explicitly"
        )
    if look.startswith("Word"):
        return (
            f"word boundaries (\\b, \\B, \\<, \\>) in /{regex}/ are not supported by "
            f"{engine}; match the characters around the word explicitly"
        )
    return f"the assertion {look} in /{regex}/ is not supported by {engine}"


def endless(param: str, rules: list[str], ebnf: bool) -> str:
    """The 400's message for a grammar whose ``rules`` (reachable from its start) have
    no finite string; ``ebnf``: it was written in GBNF/EBNF (its ``start`` is
    ``root``)."""
    names = [("root" if ebnf else "start") if r == "start" else r for r in rules]
    fix = 'root ::= "a" root | "a"' if ebnf else 'start: "a" start | "a"'
    if rules[0] == "start":
        through = f", through {_listed(names[1:])}" if len(names) > 1 else ""
        head = (
            f"'{param}' can never finish: the grammar has no finite string (every "
            f"expansion of its root rule '{names[0]}' recurses without end{through})"
        )
    else:
        head = (
            f"'{param}' has rules that can never finish ({_listed(names)}): every "
            "expansion of them recurses without end, so an output that enters them "
            "could never end"
        )
    return f"{head}. Give each recursion an alternative that ends, as in `{fix}`"


def _listed(names: list[str]) -> str:
    """``'a', 'b', 'c', 'd', ...``: the first four names."""
    return ", ".join(f"'{n}'" for n in names[:4]) + (", ..." if len(names) > 4 else "")
