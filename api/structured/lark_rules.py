"""Which rules of a Lark grammar (llguidance's dialect) can never finish.

A rule is *productive* when some expansion of it derives a finite string: an expansion
of terminals, and of rules that are productive themselves. A rule that is not (``root
::= "a" root``: every expansion leads back to itself) has no finite string, so an
output that enters it could never end; when it is the grammar's ``start`` rule, the
grammar matches no text at all. llguidance compiles such a grammar, lets the model
write ``a`` after ``a``, and stops the request mid-generation once its parser hits a
limit; the gateway tells the client why before any work (``houchu.api.structured.request``).

Only the rules' structure is read: alternatives (``|``), sequences, groups, optional
parts (``[...]``, ``?``, ``*``, ``~ 0..n``, ``{0,n}``), ``+`` and the other
repetitions, references to rules, and the items that always match some text (strings,
regexes, terminals, special tokens, ``%json`` / ``%regex`` / ``%lark`` bodies, ``@``
references). A grammar this reader does not follow (a construct it does not know) is
not judged: ``endless_rules`` gives None and llguidance's own checks stand.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from llguidance import grammar_from

#: Tokens of the dialect; a directive whose argument is a ``{...}`` body is read with it.
_TOKEN = re.compile(
    r"""(?P<skip>[ \t]+|(?://|\#)[^\n]*)
    |(?P<nl>(?:\r?\n)+)
    |(?P<string>"(?:\\.|[^"\\\n])*"i?)
    |(?P<regex>/(?:\\.|[^/\\\n])+/[imslux]*)
    |(?P<directive>%[a-z]+)
    |(?P<name>[!?]*[_A-Za-z][_A-Za-z0-9\-]*)
    |(?P<special><[^<>\s]+>|@[A-Za-z0-9_\-]+)
    |(?P<number>-?(?:0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]+)?))
    |(?P<punct>\.\.|->|::|[:|()\[\]?*+~,=.&{}])""",
    re.VERBOSE,
)
#: Directives followed by a ``{...}`` body (JSON, or a nested grammar).
_BODIES = ("%json", "%regex", "%lark", "%llguidance")
#: Directives whose statement defines no rule.
_SKIPPED = ("%import", "%ignore", "%llguidance")


class _Unread(Exception):
    """A construct this reader does not follow."""


@dataclass(frozen=True)
class _Tok:
    kind: str  # a _TOKEN group name, or "body"
    text: str


def endless_rules(lark: str) -> list[str] | None:
    """The rules reachable from ``start`` that have no finite string, in the order the
    grammar defines them (empty: every rule can finish; ``start`` first among them when
    the grammar matches no text at all). None when the grammar uses a construct this
    reader does not follow, or defines no ``start``."""
    try:
        rules = _rules(_tokens(lark))
    except _Unread:
        return None
    if "start" not in rules:
        return None
    productive: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in productive and _finite(body, productive, rules):
                productive.add(name)
                changed = True
    reached = _reachable(rules)
    return [name for name in rules if name in reached and name not in productive]


# ---------------------------------------------------------------- the structure
# A node is ("alt", [nodes]), ("seq", [nodes]), ("rep", node, least), ("ref", name) or
# ("text",): an item that always matches some text.
Node = tuple


def _finite(node: Node, productive: set[str], rules: dict[str, Node]) -> bool:
    """Whether ``node`` derives a finite string, given the rules known productive."""
    kind = node[0]
    if kind == "text":
        return True
    if kind == "ref":  # a terminal, or a rule llguidance will refuse if undefined
        return node[1] in productive or node[1] not in rules
    if kind == "rep":
        return node[2] == 0 or _finite(node[1], productive, rules)
    parts = [_finite(n, productive, rules) for n in node[1]]
    return any(parts) if kind == "alt" else all(parts)


def _reachable(rules: dict[str, Node]) -> set[str]:
    """The rules ``start`` refers to, directly or not (``start`` among them)."""
    seen, todo = {"start"}, [rules["start"]]
    while todo:
        node = todo.pop()
        if node[0] == "ref" and node[1] in rules and node[1] not in seen:
            seen.add(node[1])
            todo.append(rules[node[1]])
        elif node[0] in ("alt", "seq"):
            todo.extend(node[1])
        elif node[0] == "rep":
            todo.append(node[1])
    return seen


# ---------------------------------------------------------------- reading the text


def _tokens(text: str) -> list[_Tok]:
    """The tokens of ``text``: newlines kept (they end statements), a directive's
    ``{...}`` body as one token. Raises ``_Unread``."""
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Unread(text[pos : pos + 20])
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "skip":
            continue
        out.append(_Tok(kind, m.group()))
        if kind == "directive" and m.group() in _BODIES:
            end = _body_end(text, pos)
            out.append(_Tok("body", text[pos:end]))
            pos = end
    return out


def _body_end(text: str, pos: int) -> int:
    """The end of the ``{...}`` body starting at ``pos`` (after spaces): braces
    balanced, braces in double-quoted strings not counted. Raises ``_Unread``."""
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    if pos >= len(text) or text[pos] != "{":
        raise _Unread("a directive without its body")
    depth, i, in_string = 0, pos, False
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Unread("an unclosed body")


def _statements(toks: list[_Tok]) -> list[list[_Tok]]:
    """Tokens split into statements: a newline ends one unless the next line goes on
    with ``|`` or it falls inside brackets."""
    out: list[list[_Tok]] = [[]]
    depth = 0
    for i, t in enumerate(toks):
        if t.kind == "nl":
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            if depth == 0 and not (nxt is not None and nxt.text == "|"):
                out.append([])
            continue
        if t.text in ("(", "["):
            depth += 1
        elif t.text in (")", "]"):
            depth -= 1
        out[-1].append(t)
    return [s for s in out if s]


def _rules(toks: list[_Tok]) -> dict[str, Node]:
    """Each rule's body (terminal definitions and directives left out). Raises
    ``_Unread``."""
    rules: dict[str, Node] = {}
    for stmt in _statements(toks):
        head = stmt[0]
        if head.kind == "directive":
            if head.text not in _SKIPPED:
                raise _Unread(head.text)
            continue
        if head.kind != "name":
            raise _Unread(head.text)
        name = head.text.lstrip("!?")
        at = 1
        if at < len(stmt) and stmt[at].text == "[":  # llguidance's rule attributes
            at = _closing(stmt, at) + 1
        if at + 1 < len(stmt) and stmt[at].text == "." and stmt[at + 1].kind == "number":
            at += 2  # a priority
        if at >= len(stmt) or stmt[at].text != ":":
            raise _Unread(name)
        if name.lstrip("_")[:1].isupper():
            continue  # a terminal: regular, it always matches some text or fails to compile
        reader = _Reader(stmt[at + 1 :])
        body = reader.expansions()
        if not reader.done():
            raise _Unread(name)
        if name in rules:
            raise _Unread(f"{name} defined twice")
        rules[name] = body
    return rules


def _closing(stmt: list[_Tok], at: int) -> int:
    """The index of the ``]`` closing the ``[`` at ``at``. Raises ``_Unread``."""
    depth = 0
    for i in range(at, len(stmt)):
        depth += {"[": 1, "]": -1}.get(stmt[i].text, 0) if stmt[i].kind == "punct" else 0
        if depth == 0:
            return i
    raise _Unread("an unclosed '['")


class _Reader:
    """Reads one rule's expansions into nodes (recursive descent). Raises
    ``_Unread``."""

    def __init__(self, toks: list[_Tok]) -> None:
        self.toks, self.at = toks, 0

    def done(self) -> bool:
        return self.at == len(self.toks)

    def _peek(self) -> _Tok | None:
        return self.toks[self.at] if self.at < len(self.toks) else None

    def _take(self, text: str | None = None) -> _Tok:
        t = self._peek()
        if t is None or (text is not None and (t.text != text or t.kind != "punct")):
            raise _Unread(f"expected {text!r}")
        self.at += 1
        return t

    def _at_punct(self, *texts: str) -> bool:
        t = self._peek()
        return t is not None and t.kind == "punct" and t.text in texts

    def expansions(self) -> Node:
        alts = [self._alternative()]
        while self._at_punct("|"):
            self._take()
            alts.append(self._alternative())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def _alternative(self) -> Node:
        parts = [self._sequence()]
        while self._at_punct("&"):  # both must match: finite only if each part is
            self._take()
            parts.append(self._sequence())
        if self._at_punct("->"):  # an alias names the tree node; it matches nothing
            self._take()
            if self._take().kind != "name":
                raise _Unread("an alias")
        return parts[0] if len(parts) == 1 else ("seq", parts)

    def _sequence(self) -> Node:
        items = []
        while (t := self._peek()) is not None and not self._at_punct("|", ")", "]", "&", "->"):
            items.append(self._repeated(self._atom(t)))
        return ("seq", items)

    def _atom(self, t: _Tok) -> Node:
        self.at += 1
        if t.kind == "punct" and t.text in ("(", "["):
            inner = self.expansions()
            self._take(")" if t.text == "(" else "]")
            return inner if t.text == "(" else ("rep", inner, 0)
        if t.kind == "string":
            if self._at_punct(".."):  # a character range "a".."z"
                self._take()
                if self._take().kind != "string":
                    raise _Unread("a range")
            return ("text",)
        if t.kind in ("regex", "special"):
            return ("text",)
        if t.kind == "directive" and t.text in ("%json", "%regex", "%lark"):
            self._take_body()
            return ("text",)
        if t.kind == "name" and t.text == t.text.lstrip("!?"):
            return ("ref", t.text)
        raise _Unread(t.text)

    def _take_body(self) -> None:
        t = self._peek()
        if t is None or t.kind != "body":
            raise _Unread("a directive without its body")
        self.at += 1

    def _repeated(self, node: Node) -> Node:
        while True:
            if self._at_punct("?", "*"):
                self._take()
                node = ("rep", node, 0)
            elif self._at_punct("+"):
                self._take()
                node = ("rep", node, 1)
            elif self._at_punct("~"):  # item ~ n, item ~ n..m
                self._take()
                node = ("rep", node, self._count())
                if self._at_punct(".."):
                    self._take()
                    self._count()
            elif self._at_punct("{"):  # item{n}, item{n,}, item{n,m}
                self._take()
                node = ("rep", node, self._count())
                while not self._at_punct("}"):
                    if self._take().kind not in ("punct", "number"):
                        raise _Unread("a repetition")
                self._take("}")
            else:
                return node

    def _count(self) -> int:
        t = self._take()
        if t.kind != "number" or not t.text.isdigit():
            raise _Unread("a count")
        return int(t.text)


@functools.lru_cache(maxsize=64)
def ebnf_to_lark(text: str) -> str:
    """GBNF/EBNF ``text`` as llguidance's Lark grammar (``grammar_from("ebnf", ...)``),
    the last 64 kept: the conversion grows with the square of the rules (2.3 s for a
    3,000-rule chain), so a grammar sent again (a client retrying a refused request) is
    not converted again before its kept verdict (``grammar_guard``) answers it."""
    return grammar_from("ebnf", text)
