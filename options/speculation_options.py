"""Speculative decoding options: the "speculative decoding" group of ``houchu serve``'s
flags."""

from __future__ import annotations

from typing import Literal

import msgspec

#: The ways to propose tokens (``speculative``).
METHODS = ("ngram", "draft", "mtp")


class SpeculativeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Speculative decoding, read by the scheduler (``houchu.speculative.scheduling``), the
    launcher and the draft actor; each field is the ``houchu serve`` flag of its name.

    Attributes:
        speculative: "ngram" (prompt lookup), "draft" (``draft_model``), "mtp" (the
            checkpoint's own next-token-prediction layers, DeepSeek-V3's
            ``num_nextn_predict_layers``), or None (off).
        draft_model: the draft model's .gguf file or HF folder (absolute path), sharing
            the model's tokenizer.
        num_speculative_tokens: most proposals verified per request per step.
        speculative_max_batch: speculate only while at most this many requests decode
            (None: the break-even batch size measured at start-up and while serving).
    """

    speculative: Literal["ngram", "draft", "mtp"] | None = None
    draft_model: str | None = None
    num_speculative_tokens: int = 4
    speculative_max_batch: int | None = None

    @property
    def enabled(self) -> bool:
        """Whether speculative decoding is on."""
        return self.speculative is not None

    @property
    def proposes_in_runner(self) -> bool:
        """Whether the model runner makes the proposals ("mtp": from its own hidden
        states), so that no draft actor runs."""
        return self.speculative == "mtp"

    @property
    def uses_draft_actor(self) -> bool:
        """Whether a draft actor proposes ("ngram", "draft")."""
        return self.enabled and not self.proposes_in_runner

    def validate(self) -> None:
        """Raises:
        ValueError: speculation is off or unknown, or a size is not positive."""
        if self.speculative not in METHODS:
            raise ValueError(
                f"speculative method must be one of {METHODS}, got {self.speculative!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        if self.speculative_max_batch is not None and self.speculative_max_batch < 0:
            raise ValueError(
                f"speculative_max_batch must be >= 0, got {self.speculative_max_batch}"
            )
