"""Batched sampling with per-request parameters.

Pipeline per row (logits ``[R, V]`` float32):

0. logits processors (``houchu.model.sampling.logits_processors``): ``logit_bias``,
   ``allowed_token_ids``, ``bad_words``, ``min_tokens``;
1. penalties: repetition (CTRL, Keskar et al. 2019: a seen token's logit is divided by
   the penalty if positive, multiplied if negative; seen = prompt + generated, as vLLM),
   then frequency and presence (OpenAI: ``logit -= f * count + p * (count > 0)``, counts
   over generated tokens only);
1b. structured output: the tokens the request's grammar disallows become -inf, after
   the processors, so a constrained request follows its grammar whatever its
   ``logit_bias`` (where the processors left only disallowed tokens, the grammar's mask
   is applied to the logits before them: ``apply_grammar_masks``);
2. temperature == 0 (below 1e-5): greedy argmax of the penalized logits;
3. otherwise: divide by temperature, then top-k, top-p (nucleus, Holtzman et al. 2019),
   min-p (Nguyen et al. 2024) — Hugging Face's warper order — softmax, and one
   draw per row by inversion (``houchu.model.sampling.warpers``). A seeded request's draw for its output token ``t`` (0 for
   the first generated token) comes from a generator seeded with ``draw_seed(seed, t)``
   (counter-based, as Philox-style samplers key their noise): the noise is a function of
   the seed (choice ``i`` of a request has ``seed + i``) and the token's position only,
   never of the step, the batch's order, speculation or preemption. An unseeded row draws
   from the sampler's shared generator.

Log-probabilities (when asked) are ``log_softmax`` of the raw logits by default (vLLM's
default "raw" mode), or of the processed logits with ``logprobs_mode="processed"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.model.sampling.logits_processors import LogitsProcessors, apply_processors
from houchu.model.sampling.warpers import apply_min_p, apply_top_k, apply_top_p, draw_rows
from houchu.transport.messages import SamplingParams
from houchu.transport.request_fields import sampling_problem

GREEDY_EPS = 1e-5  # temperatures below this are greedy
#: Smallest repetition penalty applied (a smaller one would overflow float32 logits).
MIN_REPETITION_PENALTY = 1e-20
#: Largest repetition penalty applied: a larger one (the API takes any finite value; in
#: float32 above ~3.4e38 it is infinite) would make a seen logit of 0 NaN (0 * inf) and
#: overflow negative ones to -inf; at 1e20 a seen token's positive logit is already about
#: 0 and a negative one pushed far down, as any larger penalty would leave them.
MAX_REPETITION_PENALTY = 1e20


class RequestState:
    """A request's sampling state in the runner, from ``SeqInit`` until release.

    Attributes:
        params: the request's ``SamplingParams``.
        prompt_ids: the prompt's token ids.
        generated: token ids sampled so far (appended only when sampled).
        generator: the seeded request's ``torch.Generator``, re-seeded with
            ``draw_seed(params.seed, len(generated))`` before each draw; None unseeded.
        seen: ``[V]`` bool, tokens in prompt or generated (only with a repetition penalty).
        counts: ``[V]`` float32, generated-token counts (only with frequency/presence).
        processors: its logits processors, or None (``LogitsProcessors.of``).
        prompt_logprobs_done: prompt positions whose next token's log-probability was
            already returned (``houchu.model.sampling.prompt_logprobs``).

    ``stop_ids``: the ids that end the request (for ``min_tokens``).

    Raises:
        ValueError: sampling parameters out of their domains (``validate_params``,
            ``logits_processors.check_params``) or a prompt token id outside
            ``0..vocab_size-1``.
    """

    def __init__(
        self,
        rid: str,
        params: SamplingParams,
        prompt_ids: list[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
        stop_ids: Sequence[int] = (),
    ) -> None:
        validate_params(params, rid)
        try:
            self.processors = LogitsProcessors.of(params, stop_ids, vocab_size, device)
        except ValueError as e:
            raise ValueError(f"request {rid!r}: {e}") from None
        self.prompt_logprobs_done = 0
        if prompt_ids and (min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size):
            raise ValueError(f"request {rid!r}: prompt token id out of range 0..{vocab_size - 1}")
        self.rid, self.params, self.prompt_ids = rid, params, list(prompt_ids)
        self.generated: list[int] = []
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device)
        self.seen: torch.Tensor | None = None  # [V] bool
        self.counts: torch.Tensor | None = None  # [V] float32
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            if prompt_ids:
                self.seen[torch.tensor(prompt_ids, device=device)] = True
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)

    def draw_generator(self) -> torch.Generator | None:
        """The generator for this request's next draw: a seeded request's own, keyed to
        ``(seed, position of the token drawn)`` (``draw_seed``); None when unseeded."""
        if self.generator is None or self.params.seed is None:
            return None
        self.generator.manual_seed(draw_seed(self.params.seed, len(self.generated)))
        return self.generator

    def append(self, token_id: int) -> None:
        """Record a sampled token (for penalties)."""
        self.generated.append(token_id)
        if self.seen is not None:
            self.seen[token_id] = True
        if self.counts is not None:
            self.counts[token_id] += 1.0


_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


def draw_seed(seed: int, position: int) -> int:
    """The 64-bit seed of a seeded request's draw for its output token ``position``.

    SplitMix64's finaliser (Steele, Lea and Flood 2014, "Fast splittable pseudorandom
    number generators") over ``seed + (position + 1) * golden ratio``: distinct, well
    mixed seeds for neighbouring seeds and positions, so choice ``i``'s stream (seed
    ``seed + i``) is not choice ``i + 1``'s shifted by one token.

    Args:
        seed: the request's seed (any int64 or uint64; taken modulo 2**64).
        position: the output token's index, 0 for the first generated token.
    Returns:
        An int in ``0 .. 2**64 - 1``.
    """
    z = (seed + (position + 1) * 0x9E37_79B9_7F4A_7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return z ^ (z >> 31)


def validate_params(p: SamplingParams, rid: str = "?") -> None:
    """Raise ``ValueError`` for parameters outside their domains: the bounds of the
    wire's types (``houchu.transport.request_fields.sampling_problem``), checked again
    here for parameters built in-process rather than decoded."""
    problem = sampling_problem(p)
    if problem is not None:
        raise ValueError(f"request {rid!r}: invalid sampling parameters: {problem}")


@dataclass
class Sample:
    """One row's result: the token, and (when asked) its log-probability and the top-n
    ``(token_id, logprob)`` pairs, best first."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


def apply_penalties(logits: torch.Tensor, states: list[RequestState]) -> torch.Tensor:
    """Repetition, then frequency and presence penalties (module docstring).

    Args:
        logits: ``[R, V]`` float32 (not modified).
        states: R request states, row order.
    Returns:
        ``[R, V]`` float32, penalized (the input itself when no row has penalties).
    """
    rep = [i for i, s in enumerate(states) if s.seen is not None]
    frq = [i for i, s in enumerate(states) if s.counts is not None]
    if not rep and not frq:
        return logits
    out = logits.clone()
    dev = logits.device
    if rep:
        idx = torch.tensor(rep, device=dev)
        seen = torch.stack([states[i].seen for i in rep])  # [Rp, V] bool
        pen = torch.tensor([states[i].params.repetition_penalty for i in rep], device=dev)[
            :, None
        ]  # [Rp, 1]
        # a tiny one underflows in float32, a huge one is infinite there
        pen = pen.clamp(MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
        x = out[idx]  # [Rp, V]
        out[idx] = torch.where(seen, torch.where(x > 0, x / pen, x * pen), x)
    if frq:
        idx = torch.tensor(frq, device=dev)
        counts = torch.stack([states[i].counts for i in frq])  # [Rf, V]
        f = torch.tensor([states[i].params.frequency_penalty for i in frq], device=dev)
        p = torch.tensor([states[i].params.presence_penalty for i in frq], device=dev)
        out[idx] -= f[:, None] * counts + p[:, None] * (counts > 0).float()
    return out


def apply_grammar_masks(
    logits: torch.Tensor,
    masks: list[torch.Tensor | None] | None,
    fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    """Set the tokens a row's grammar disallows to -inf.

    The grammar always wins: where the logits processors left a constrained row only
    tokens its grammar disallows (``logit_bias`` 100 or ``allowed_token_ids`` on a
    forbidden token), the row is masked from ``fallback`` (the logits before the
    processors) instead, so it still samples a grammar-allowed token.

    Args:
        logits: ``[R, V]`` float32 (not modified).
        masks: per row, ``[V]`` bool (True: allowed) or None (unconstrained).
        fallback: ``[R, V]`` float32 or None (no fallback).
    Returns:
        ``[R, V]`` float32 (the input itself when no row is constrained).
    """
    rows = [i for i, m in enumerate(masks or ()) if m is not None]
    if not rows:
        return logits
    assert masks is not None
    ninf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    idx = torch.tensor(rows, device=logits.device)
    allowed = torch.stack([masks[i] for i in rows])  # [Rc, V] bool
    if len(rows) == logits.shape[0]:  # every row constrained: one pass, no clone
        out = torch.where(allowed, logits, ninf)  # [R, V]
    else:
        out = logits.clone()
        out[idx] = torch.where(allowed, logits[idx], ninf)
    if fallback is not None and fallback is not logits:
        dead = torch.isneginf(out[idx]).all(dim=-1)  # [Rc] bool: nothing left to sample
        if bool(dead.any()):
            gone = idx[dead]
            out[gone] = fallback[gone].masked_fill(~allowed[dead], float("-inf"))
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` for ``[R, V]`` logits -> ``[R]`` int64 (the first maximum; a NaN
    counts as the maximum), on houchu's C++ kernel for float32 CPU rows (torch's CPU
    argmax over a 49k vocabulary takes ~45 µs, the kernel a few µs)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and cpu_kernels.is_loaded():
        if x.dim() == 2 and x.shape[1] > 0 and (x.stride(1) == 1 or x.shape[1] == 1):
            return cpu_kernels.ops().argmax_rows(x)
    return x.argmax(dim=-1)


class Sampler:
    """Samples one token per row. ``seed`` seeds the generator shared by unseeded rows
    (None: nondeterministic). ``logprobs_mode``: "raw" or "processed".

    Raises:
        ValueError: another ``logprobs_mode``.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        logprobs_mode: str = "raw",
    ) -> None:
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.device = torch.device(device)
        self.shared = torch.Generator(device=self.device)
        if seed is None:
            self.shared.seed()
        else:
            self.shared.manual_seed(seed)
        self.logprobs_mode = logprobs_mode

    def sample(
        self,
        logits: torch.Tensor,
        states: list[RequestState],
        masks: list[torch.Tensor | None] | None = None,
    ) -> list[Sample]:
        """Draw one token per row.

        Args:
            logits: ``[R, V]`` float32 raw logits.
            states: R request states, row order.
            masks: per row, the tokens its grammar allows (``[V]`` bool) or None
                (structured output, ``houchu.model.grammar.matcher``); applied after penalties.
        Returns:
            R ``Sample``s (logprob fields set only for requests with ``logprobs``).
        """
        r = logits.shape[0]
        if r == 0:
            return []
        dev = logits.device
        # logits processors, then penalties, then the grammar's mask: a constrained
        # request only ever samples a token its grammar allows, whatever its logit_bias
        x = apply_processors(logits, [s.processors for s in states], [s.generated for s in states])
        penalised = apply_penalties(x, states)  # [R, V]
        fallback = None if x is logits or masks is None else apply_penalties(logits, states)
        x = apply_grammar_masks(penalised, masks, fallback)  # [R, V]
        temps = [s.params.temperature for s in states]
        rand = [i for i, t in enumerate(temps) if t >= GREEDY_EPS]
        tokens = argmax_rows(x)  # [R] int64 (greedy rows keep this)
        processed = x
        if rand:
            idx = torch.tensor(rand, device=dev)
            ps = [states[i].params for i in rand]
            y = x[idx] / torch.tensor([p.temperature for p in ps], device=dev)[:, None]
            y = apply_top_k(y, torch.tensor([p.top_k for p in ps], device=dev))
            y = apply_top_p(y, torch.tensor([p.top_p for p in ps], device=dev))
            y = apply_min_p(y, torch.tensor([p.min_p for p in ps], device=dev))
            probs = y.softmax(dim=-1)  # [Rr, V]
            bad = ~torch.isfinite(probs).all(dim=-1)  # [Rr]; never fail the whole batch
            if bool(bad.any()):
                top = x[idx][bad].argmax(dim=-1)
                probs[bad] = torch.nn.functional.one_hot(top, probs.shape[-1]).to(probs.dtype)
            gens = [states[i].draw_generator() for i in rand]
            tokens[idx] = draw_rows(probs, gens, self.shared)
            if self.logprobs_mode == "processed":
                processed = x.clone()
                processed[idx] = y
        token_list = tokens.tolist()
        out = [Sample(token_id=t) for t in token_list]
        want = [i for i, s in enumerate(states) if s.params.logprobs]
        if want:
            idx = torch.tensor(want, device=dev)
            src = logits if self.logprobs_mode == "raw" else processed
            lp = torch.log_softmax(src[idx], dim=-1)  # [Rl, V]
            chosen = lp.gather(1, tokens[idx][:, None])[:, 0].tolist()
            n = max(states[i].params.top_logprobs for i in want)
            top_v, top_i = lp.topk(n, dim=-1) if n > 0 else (lp[:, :0], lp[:, :0].long())
            top_v, top_i = top_v.tolist(), top_i.tolist()
            for j, i in enumerate(want):
                k = states[i].params.top_logprobs
                out[i].logprob = chosen[j]
                pairs = zip(top_i[j][:k], top_v[j][:k], strict=True)
                # ties by token id, as greedy's argmax breaks them (topk's order is arbitrary)
                out[i].top_logprobs = sorted(pairs, key=lambda p: (-p[1], p[0]))
        return out
