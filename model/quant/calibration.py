"""Calibration text for GPTQ (``houchu.model.quant.gptq``): the tokens a model reads so that
each projection's inputs can be measured before its weights are quantized.

``--calibration-text FILE`` names a UTF-8 text; without it houchu reads English prose it
finds on every Python installation: the standard library's reference topics
(``pydoc_data.topics``, the text of Python's language reference that ``help()`` shows),
in a fixed order. Whatever the source, the first ``DEFAULT_TOKENS`` tokens are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from houchu.model.batch import build_batch
from houchu.model.kv.pool import KVPool
from houchu.model.llama import LlamaModel
from houchu.transport.messages import SeqWork

#: calibration tokens read by default (GPTQ's paper uses 128 x 2048; a few thousand
#: already fix the Hessians of models of houchu's sizes to within their damping)
DEFAULT_TOKENS = 4096
#: characters of the default text read (more than DEFAULT_TOKENS tokens of it)
DEFAULT_CHARS = 6 * DEFAULT_TOKENS


class CalibrationError(ValueError):
    """The calibration text cannot be read, is empty, or is shorter than 2 tokens."""


def calibration_text(path: str | Path | None) -> str:
    """The text at ``path`` (UTF-8), or the default one (module docstring).

    Raises:
        CalibrationError: the file cannot be read, is not UTF-8 or is empty.
    """
    if path is None:
        import pydoc_data.topics as topics

        return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))[:DEFAULT_CHARS]
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"--calibration-text {path}: {e}") from None
    if not text.strip():
        raise CalibrationError(f"--calibration-text {path}: the file is empty")
    return text


def calibration_ids(
    model_path: str | Path, text_path: str | Path | None, limit: int = DEFAULT_TOKENS
) -> list[int]:
    """The first ``limit`` token ids of the calibration text, by the model's tokenizer.

    Raises:
        CalibrationError: an unreadable text (``calibration_text``) or one of fewer than 2
            tokens.
        TokenizerError: the model has no usable tokenizer.
    """
    from houchu.text.tokenizer.core import load_tokenizer

    ids = load_tokenizer(model_path).encode(calibration_text(text_path))[:limit]
    if len(ids) < 2:
        raise CalibrationError("the calibration text is shorter than 2 tokens")
    return ids


def feed_tokens(model: LlamaModel, ids: Sequence[int], chunk: int = 128) -> None:
    """Run ``model`` over ``ids`` as one sequence from position 0, ``chunk`` tokens a
    step over a pool of its own (each step attends to the earlier ones): the forward
    passes, with logits for each step's last row only, not kept.

    Raises:
        ValueError: no ids.
    """
    if not ids:
        raise ValueError("no tokens to feed")
    page = 16
    n_pages = -(-len(ids) // page)
    dev = model.embed.device
    pool = KVPool.for_model(
        model.cfg, page_size=page, dtype=model.dtype, device=dev, num_pages=n_pages
    )
    from houchu.model.attention.torch import TorchSDPABackend

    backend = TorchSDPABackend()
    table = list(range(n_pages))
    with torch.inference_mode():
        for start in range(0, len(ids), chunk):
            piece = list(ids[start : start + chunk])
            work = [
                SeqWork(rid="c", token_ids=piece, start_pos=start, page_table=table, sample=True)
            ]
            b = build_batch(
                work,
                page_size=page,
                num_pages=n_pages,
                max_context=len(ids),
                vocab_size=model.cfg.vocab_size,
                device=dev,
            )
            model(b, pool, backend)  # logits of the step's last row only
