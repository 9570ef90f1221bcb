"""A request whose fixed token constraints leave no token to sample, refused before any
work (HTTP 400) rather than sampled from tokens the client ruled out.

The constraints (``houchu.model.sampling.logits_processors`` applies them) are vLLM's and
OpenAI's: ``allowed_token_ids`` (only these), ``logit_bias`` -100 (banned) and 100
(only the tokens biased by 100), a ``bad_words`` word of one token (banned), and
``min_tokens`` (no stop token, EOS or ``stop_token_ids``, before that many tokens).
Together they may leave nothing: every allowed token banned, the forced tokens outside
``allowed_token_ids``, or only stop tokens left while ``min_tokens`` holds them off.

The gateway checks what it knows (``houchu.api.requests.parts``: the vocabulary size,
``allowed_token_ids``, ``logit_bias``); the tokenizer actor, which encodes ``bad_words``
and knows the EOS ids, checks all of it. A multi-token bad word bans its last token only
after the rest of it was generated, so its conflicts appear during generation; the
sampler's rule for those is in ``houchu.model.sampling.logits_processors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from houchu.transport.failures import bad_request
from houchu.transport.messages import Failure
from houchu.transport.request_fields import MAX_LOGIT_BIAS

#: A ``logit_bias`` of this magnitude bans (negative) or forces (positive) the token: the
#: top of the wire's ``logit_bias`` values.
BIAS_LIMIT = MAX_LOGIT_BIAS


def no_token_left(
    vocab_size: int,
    *,
    allowed: Sequence[int] | None = None,
    logit_bias: Mapping[int, float] | None = None,
    bad_words_ids: Iterable[Sequence[int]] = (),
    min_tokens: int = 0,
    stop_ids: Iterable[int] = (),
) -> Failure | None:
    """The 400 of constraints that leave no token to sample at the first output
    position, or None when some token is left.

    Args:
        vocab_size: V (every id given is in ``0..V-1``; 0: unknown, nothing checked).
        allowed: ``allowed_token_ids`` (None: every token).
        logit_bias: token id -> bias (only the ends, -100 and 100, matter here).
        bad_words_ids: the bad words' token sequences (one-token words are banned).
        min_tokens: vLLM's ``min_tokens``.
        stop_ids: the ids that end the request (banned while ``min_tokens`` holds).
    Returns:
        ``Failure`` (400, ``invalid_value``) naming the parameters, or None.
    """
    if not vocab_size:
        return None
    bias = logit_bias or {}
    forced = {t for t, b in bias.items() if b >= BIAS_LIMIT}
    biased_out = {t for t, b in bias.items() if b <= -BIAS_LIMIT}
    bad = {w[0] for w in bad_words_ids if len(w) == 1}
    pool, names = _pool(allowed, forced)
    if pool is not None and not pool:
        return bad_request(
            "'logit_bias' forces (100) only tokens outside 'allowed_token_ids': no token "
            "is left to sample",
            code="invalid_value",
            param="logit_bias",
        )
    param = "allowed_token_ids" if allowed is not None else "logit_bias"
    left = _left(pool, biased_out | bad, vocab_size)
    if left == 0:
        by = [n for n, ids in (("'logit_bias' (-100)", biased_out), ("'bad_words'", bad)) if ids]
        return bad_request(
            f"{names} banned by {' and '.join(by)}: no token is left to sample",
            code="invalid_value",
            param=param,
        )
    stops = set(stop_ids)
    if min_tokens > 0 and stops and _left(pool, biased_out | bad | stops, vocab_size) == 0:
        return bad_request(
            f"'min_tokens' ({min_tokens}) holds off the stop tokens (EOS and "
            f"'stop_token_ids'), and {names} banned or stop tokens: no token is left to "
            "sample",
            code="invalid_value",
            param="min_tokens",
        )
    return None


def _pool(allowed: Sequence[int] | None, forced: set[int]) -> tuple[set[int] | None, str]:
    """(the tokens ``allowed_token_ids`` and ``logit_bias`` 100 leave, None: every
    token; how an error names them, before "banned ...")."""
    if forced and allowed is not None:
        return forced & set(allowed), (
            "the tokens both 'allowed_token_ids' and 'logit_bias' (100) allow are all"
        )
    if forced:
        return forced, "the tokens 'logit_bias' forces (100) are all"
    if allowed is not None:
        return set(allowed), "the tokens of 'allowed_token_ids' are all"
    return None, "all tokens of the vocabulary are"


def _left(pool: set[int] | None, out: set[int], vocab_size: int) -> int:
    """How many tokens of ``pool`` (None: the ``vocab_size`` ids) are not in ``out``."""
    if pool is None:
        return vocab_size - len({t for t in out if 0 <= t < vocab_size})
    return len(pool - out)
