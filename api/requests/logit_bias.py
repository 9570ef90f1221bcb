"""``logit_bias`` checked entry by entry, so a bad entry's 400 names its key and the
allowed range (OpenAI's: keys are token ids, written as strings of digits; values are
-100..100), rather than the schema's generic wording.

The request type (``houchu.api.schema.bodies.LogitBias``, its values the wire's
``LogitBiasValue``) states the same bounds for the OpenAPI document; this check runs on
the raw body first, so its messages are the ones a client sees.
"""

from __future__ import annotations

import re
from typing import Any

from houchu.api.errors import ApiError
from houchu.transport.request_fields import MAX_LOGIT_BIAS

#: A token id as ``logit_bias`` keys write it (the schema's pattern).
TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")


def check_logit_bias(value: Any, vocab_size: int = 0) -> None:
    """Check a raw ``logit_bias`` object: each key a token id in ``0..vocab_size - 1``
    (``vocab_size`` 0: the vocabulary is unknown, only the form is checked), each value
    a number in ``-100..100``. Anything but an object is left to the schema's check.

    Raises:
        ApiError: (400, ``invalid_value``, ``param`` "logit_bias") naming the key.
    """
    if not isinstance(value, dict):
        return
    ids = f"0..{vocab_size - 1}" if vocab_size else "0 up to the vocabulary size"
    lo, hi = -int(MAX_LOGIT_BIAS), int(MAX_LOGIT_BIAS)
    for key, bias in value.items():
        if not TOKEN_ID_KEY.fullmatch(key):
            _fail(f"'logit_bias' key {key!r} is not a token id: keys are token ids {ids}")
        if vocab_size and int(key) >= vocab_size:
            _fail(
                f"'logit_bias' key {key!r} is outside this model's vocabulary: keys are "
                f"token ids {ids}"
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            _fail(f"'logit_bias' value of key {key!r} must be a number from {lo} to {hi}")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            _fail(f"'logit_bias' value of key {key!r} is {bias}: biases are from {lo} to {hi}")


def _fail(message: str) -> None:
    raise ApiError(message, param="logit_bias", code="invalid_value")
