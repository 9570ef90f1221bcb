"""Per-request logits processors: ``logit_bias``, ``allowed_token_ids``, ``bad_words``
and ``min_tokens``, applied in the sampler before penalties and temperature.

Definitions:

- ``logit_bias`` (OpenAI): token id -> bias in [-100, 100], added to that token's logit.
  The ends mean what OpenAI says they should: -100 bans the token (its logit becomes
  -inf), 100 selects it exclusively (every token not biased by 100 becomes -inf; several
  at 100 compete by their logits).
- ``allowed_token_ids`` (vLLM): every other token is -inf.
- ``bad_words`` (vLLM, ``vllm.v1.sample.ops.bad_words``): each word's token sequences
  (encoded by the tokenizer actor into ``SamplingParams.bad_words_ids``); a one-token word
  is always banned, a longer one's last token is banned when the generated tokens end
  with the rest of it.
- ``min_tokens`` (vLLM): the request's stop ids (EOS and ``stop_token_ids``) are -inf
  until ``min_tokens`` tokens were generated.

The fixed constraints (``allowed_token_ids``, ``logit_bias`` at -100 / 100, one-token bad
words, and ``min_tokens`` against them) always leave a token: a request where they would
not is refused with a 400 before any work (``houchu.text.token_conflicts``). The bans that
depend on the generated tokens can still leave a row nothing to sample at some position
(``allowed_token_ids: [a, b]`` with the bad words "a a" and "a b", after "a"). Then the
hard constraints stay and the dynamic bans give way, one kind at a time: a multi-token
bad word's ban is kept when some token is left with it, else not applied at that
position; then ``min_tokens``' ban of the stop tokens likewise (so such a row may end
before ``min_tokens``, rather than write a bad word or a token outside its allowed
set). The tokens the client allowed or forced are never left for others.

Each request's fixed part is one ``[V]`` float32 row built once (bias, bans, allowed
set) and a ``[V]`` bool row of forced tokens; a step adds the rows of the requests that
have one in a single batched op. The parts that change with the generated tokens
(``min_tokens``, multi-token bad words) are (row, token) pairs set to -inf in one
indexed write.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from houchu.text.token_conflicts import BIAS_LIMIT
from houchu.transport.messages import SamplingParams


class LogitsProcessors:
    """One request's processors (``LogitsProcessors.of`` returns None when it has none).

    Attributes:
        additive: ``[V]`` float32 added to the row (bias; -inf for banned and
            not-allowed tokens), or None.
        forced: ``[V]`` bool, the tokens biased by +100, or None.
        stop_ids: ids banned while fewer than ``min_tokens`` tokens were generated.
        min_tokens: see the module docstring.
        bad_sequences: bad words of two or more tokens.
    """

    def __init__(
        self,
        additive: torch.Tensor | None,
        forced: torch.Tensor | None,
        stop_ids: list[int],
        min_tokens: int,
        bad_sequences: list[tuple[int, ...]],
    ) -> None:
        self.additive = additive
        self.forced = forced
        self.stop_ids = stop_ids
        self.min_tokens = min_tokens
        self.bad_sequences = bad_sequences

    @classmethod
    def of(
        cls,
        params: SamplingParams,
        stop_ids: Sequence[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> LogitsProcessors | None:
        """The processors of a request, or None when it asks for none.

        Args:
            params: its ``logit_bias``, ``allowed_token_ids``, ``bad_words_ids``,
                ``min_tokens``.
            stop_ids: the ids that end it (for ``min_tokens``).
            vocab_size: V.
            device: where the ``[V]`` rows live.
        Raises:
            ValueError: a token id outside ``0..V-1``, a bias outside [-100, 100] or not
                finite, an empty ``allowed_token_ids``, an empty bad word, or a negative
                ``min_tokens``.
        """
        check_params(params, vocab_size)
        singles = [w[0] for w in params.bad_words_ids if len(w) == 1]
        sequences = list(dict.fromkeys(tuple(w) for w in params.bad_words_ids if len(w) > 1))
        has_static = bool(params.logit_bias or params.allowed_token_ids is not None or singles)
        stops = list(stop_ids) if params.min_tokens > 0 else []
        if not has_static and not stops and not sequences:
            return None
        additive = forced = None
        if has_static:
            additive = torch.zeros(vocab_size, dtype=torch.float32)  # [V]
            if params.allowed_token_ids is not None:
                additive.fill_(float("-inf"))
                additive[torch.tensor(params.allowed_token_ids, dtype=torch.long)] = 0.0
            top = [t for t, b in params.logit_bias.items() if b >= BIAS_LIMIT]
            for t, b in params.logit_bias.items():
                additive[t] += float("-inf") if b <= -BIAS_LIMIT else b
            if singles:
                additive[torch.tensor(singles, dtype=torch.long)] = float("-inf")
            additive = additive.to(device)
            if top:
                forced = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
                forced[torch.tensor(top, dtype=torch.long)] = True
                forced = forced.to(device)
        return cls(additive, forced, stops, params.min_tokens, sequences)

    def word_bans(self, generated: Sequence[int]) -> list[int]:
        """The last tokens of the multi-token bad words whose other tokens end
        ``generated`` (banned at the next position)."""
        out = []
        for seq in self.bad_sequences:
            n = len(seq) - 1
            if len(generated) >= n and tuple(generated[len(generated) - n :]) == seq[:-1]:
                out.append(seq[-1])
        return out

    def stop_bans(self, generated: Sequence[int]) -> list[int]:
        """The stop ids, while fewer than ``min_tokens`` tokens were generated."""
        return list(self.stop_ids) if len(generated) < self.min_tokens else []


def check_params(params: SamplingParams, vocab_size: int) -> None:
    """Raise ``ValueError`` for token ids outside this model's vocabulary (the gateway
    refuses them with a 400 first; this guards the runner). The bounds that do not
    depend on the model (bias values, empty lists, ``min_tokens``) are the wire's types
    (``houchu.transport.request_fields``), checked when the parameters decode or by the
    sampler's ``sampling_problem``."""

    def bad_id(t: int) -> bool:
        return not 0 <= t < vocab_size

    problems = []
    if any(bad_id(t) for t in params.logit_bias):
        problems.append(f"logit_bias token id out of range 0..{vocab_size - 1}")
    if params.allowed_token_ids is not None and any(map(bad_id, params.allowed_token_ids)):
        problems.append(f"allowed_token_ids token id out of range 0..{vocab_size - 1}")
    if any(bad_id(t) for w in params.bad_words_ids for t in w):
        problems.append("bad word with a token id out of range")
    if problems:
        raise ValueError(f"invalid logits processors: {', '.join(problems)}")


def apply_processors(
    logits: torch.Tensor,
    processors: Sequence[LogitsProcessors | None],
    generated: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Apply each row's processors (module docstring).

    Args:
        logits: ``[R, V]`` float32 (not modified).
        processors: R entries, row order (None: the row has none).
        generated: R lists, each row's generated token ids so far.
    Returns:
        ``[R, V]`` float32 (the input itself when no row has processors).
    """
    rows = [i for i, p in enumerate(processors) if p is not None]
    if not rows:
        return logits
    dev = logits.device
    out = logits.clone()
    add = [i for i in rows if processors[i].additive is not None]
    if add:
        idx = torch.tensor(add, device=dev)
        out[idx] += torch.stack([processors[i].additive for i in add])  # [Ra, V]
    force = [i for i in rows if processors[i].forced is not None]
    if force:
        idx = torch.tensor(force, device=dev)
        mask = torch.stack([processors[i].forced for i in force])  # [Rf, V] bool
        out[idx] = out[idx].masked_fill(~mask, float("-inf"))
    for kind in (LogitsProcessors.word_bans, LogitsProcessors.stop_bans):
        _ban_where_some_token_stays(out, {i: kind(processors[i], generated[i]) for i in rows})
    return out


def _ban_where_some_token_stays(out: torch.Tensor, bans: dict[int, list[int]]) -> None:
    """Set ``out[row, id]`` to -inf for each row's ``bans``, in place, in the rows where
    some finite logit stays (a row the bans would leave with none keeps its logits).

    Args:
        out: ``[R, V]`` float32.
        bans: row -> token ids to ban (rows with none may be left out or empty).
    """
    rows = [i for i, ids in bans.items() if ids]
    if not rows:
        return
    dev = out.device
    local = [j for j, i in enumerate(rows) for _ in bans[i]]
    ids = [t for i in rows for t in bans[i]]
    idx = torch.tensor(rows, device=dev)
    sub = out[idx]  # [Rb, V] (a copy)
    sub[torch.tensor(local, device=dev), torch.tensor(ids, device=dev)] = float("-inf")
    keep = ~torch.isneginf(sub).all(dim=-1)  # [Rb] bool: some token left
    out[idx[keep]] = sub[keep]
