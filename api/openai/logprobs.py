"""The ``logprobs`` bodies of the OpenAI API (chat and legacy completions), vLLM's
``prompt_logprobs`` and the WebSocket API's per-token objects."""

from __future__ import annotations

from typing import Any

from houchu.transport.messages import PromptTokenLogprob, TokenLogprob


def vllm_prompt_logprobs(
    lps: list[PromptTokenLogprob] | None,
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, None for the first, else
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` for the token (first, as vLLM
    orders it) and its top alternatives (as many as the request's ``prompt_logprobs``:
    none for 0)."""
    if lps is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps:
        if lp.logprob is None:
            out.append(None)
            continue
        entry = {
            str(lp.token_id): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.token}
        }
        for r, (t, i, p) in enumerate(lp.top):
            entry.setdefault(str(i), {"logprob": p, "rank": r + 1, "decoded_token": t})
        out.append(entry)
    return out


def echo_logprobs(
    lps: list[PromptTokenLogprob], top_n: int, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """The prompt's part of an echoed completion's ``logprobs`` (legacy format, as
    ``completion_logprobs``): the first token's ``token_logprobs`` and ``top_logprobs``
    are null, as OpenAI and vLLM return them. Returns it and the offset after it."""
    return _legacy(lps, top_n, offset)


def join_logprobs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two legacy ``logprobs`` bodies, one after the other."""
    return {k: a[k] + b[k] for k in a}


def token_bytes(token: str) -> list[int]:
    """UTF-8 bytes of a token's text (for alternatives, whose raw bytes are not sent)."""
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(lps: list[TokenLogprob], top_n: int) -> dict[str, Any]:
    """Chat format: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``."""
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": list(lp.bytes_),
                "top_logprobs": [
                    {"token": t, "logprob": p, "bytes": token_bytes(t)}
                    for t, _, p in lp.top[:top_n]
                ],
            }
            for lp in lps
        ]
    }


def completion_logprobs(
    lps: list[TokenLogprob], top_n: int, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Legacy completions format, and the text offset after the last token.

    ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``;
    each ``top_logprobs`` entry holds the ``top_n`` best alternatives and the sampled
    token (so up to ``top_n + 1`` entries, as in the OpenAI API). ``text_offset`` counts
    characters from the start of the completion, continuing from ``offset``.
    """
    return _legacy(lps, top_n, offset)


def _legacy(
    lps: list[TokenLogprob] | list[PromptTokenLogprob], top_n: int, offset: int
) -> tuple[dict[str, Any], int]:
    """The legacy ``logprobs`` body of ``lps`` (a token without a log-probability, the
    prompt's first, gets null ``top_logprobs``) and the text offset after it."""
    tokens, token_lps, tops = [], [], []
    for lp in lps:
        tokens.append(lp.token)
        token_lps.append(lp.logprob)
        if lp.logprob is None:
            tops.append(None)
        else:
            top = {t: p for t, _, p in lp.top[:top_n]}
            top.setdefault(lp.token, lp.logprob)
            tops.append(top)
    offsets, offset = text_offsets(lps, offset)
    body = {
        "tokens": tokens,
        "token_logprobs": token_lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset


def text_offsets(
    lps: list[TokenLogprob] | list[PromptTokenLogprob], offset: int = 0
) -> tuple[list[int], int]:
    """The legacy ``text_offset`` of each token of ``lps``, counted in characters of the
    tokens' texts from ``offset``, and the offset after the last. A token that splits a
    UTF-8 character has U+FFFD as its text, one character, as vLLM counts it."""
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.token)
    return offsets, offset


def ws_logprobs(
    lps: list[TokenLogprob] | list[PromptTokenLogprob],
    top_n: int,
    offsets: list[int] | None = None,
) -> list[dict[str, Any]]:
    """WebSocket format: one object per token, with token ids; a prompt token without a
    log-probability (the first, with ``echo``) has null ``logprob`` and ``top_logprobs``.
    With ``offsets`` (``text_offsets``, with ``echo``) each also has its
    ``text_offset``."""
    out = []
    for k, lp in enumerate(lps):
        top = None
        if lp.logprob is not None:
            top = [{"token": t, "token_id": i, "logprob": p} for t, i, p in lp.top[:top_n]]
        entry: dict[str, Any] = {
            "token": lp.token,
            "token_id": lp.token_id,
            "logprob": lp.logprob,
            "bytes": list(lp.bytes_),
            "top_logprobs": top,
        }
        if offsets is not None:
            entry["text_offset"] = offsets[k]
        out.append(entry)
    return out
