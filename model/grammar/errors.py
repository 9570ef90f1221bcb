"""The 400 a constrained request ends with when its llguidance matcher enters an error
state during generation (``houchu.model.grammar.matcher.RequestGrammar.failure``).

Two cases are told apart by the matcher's error and where it happened:

- ``NoExtensionBias`` before any output token: no token can start an output the grammar
  accepts, and the empty output is not accepted either. The grammar compiled (its
  language is well formed) but matches no text this model can write, such as the regex
  ``[^\\x00-\\x{10FFFF}]`` (no character at all). llguidance finds it only when it
  computes the first mask: the request's 400 says so (code ``invalid_grammar``).
- anything else (an Earley row above ``max_items_in_row``, a lexer that builds too many
  states, "too many expressions constructed"): llguidance hit one of its limits on this
  grammar, limits it cannot check when compiling since it builds its lexer lazily
  (code ``grammar_too_complex``).
"""

from __future__ import annotations

from houchu.transport.failures import bad_request
from houchu.transport.messages import Failure

#: ``Failure.code`` of a grammar llguidance stopped following during generation.
GRAMMAR_TOO_COMPLEX = "grammar_too_complex"
#: ``Failure.code`` of a grammar that matches no text (as of one that does not compile).
INVALID_GRAMMAR = "invalid_grammar"
#: llguidance's error when no token extends the output and the grammar is not complete.
NO_EXTENSION = "NoExtensionBias"


def first_line(message: str) -> str:
    """llguidance's error without the parser state it may append."""
    return message.strip().split("\n", 1)[0].strip() or "no reason given"


def matcher_failure(error: str, consumed: int, param: str) -> Failure:
    """The 400 of a matcher in an error state.

    Args:
        error: the matcher's error (``LLMatcher.get_error``).
        consumed: output tokens the matcher had taken before it.
        param: the request field the grammar came from ("" when unknown).
    """
    why = first_line(error)
    where = f"'{param}'" if param else "the structured output constraint"
    if consumed == 0 and why == NO_EXTENSION:
        return bad_request(
            f"{where} matches no text: no output this model can write satisfies it "
            f"(the grammar engine allows no first token: {why})",
            code=INVALID_GRAMMAR,
            param=param or None,
        )
    return bad_request(
        f"{where} is too complex for the grammar engine (llguidance stopped after "
        f"{consumed} output tokens: {why}); simplify it",
        code=GRAMMAR_TOO_COMPLEX,
        param=param or None,
    )
