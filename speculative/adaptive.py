"""When speculation pays, and with how many tokens: a measured cost model.

Decode is serial: a batch of ``B`` requests gets ``B`` tokens per target pass of
``t(B)`` seconds. Verifying ``k`` proposals each costs one pass over ``B·(k+1)`` tokens
plus the draft's ``k`` passes, and yields ``E(k, α)`` tokens per request, where ``α`` is
the probability that a proposal is accepted (Leviathan et al. 2023, eq. 1)::

    E(k, α) = (1 - α^(k+1)) / (1 - α)
    gain(B, k, α) = E(k, α) · t(B) / (t(B·(k+1)) + k · d(B))

While the pass is bandwidth-bound, ``t(B·(k+1)) ≈ t(B)`` and the gain is ``E`` — free
tokens; once the batch fills the hardware, ``t`` grows with tokens and the gain drops
below 1. ``t`` (seconds per target pass by tokens in the pass) and ``d`` (seconds per
draft pass by batch size, the round trip to the draft actor included) are measured:
``t`` by a calibration at start-up and from every decode step after; ``d`` from every
draft reply. ``α`` is estimated per request from its recent verifications, with the
engine-wide estimate as prior.

The break-even batch size is the largest ``B`` for which some ``k`` has ``gain > 1`` at
the engine-wide ``α``; above it (or above ``--speculative-max-batch`` when given)
speculation is off.
"""

from __future__ import annotations

import math

#: Acceptance assumed before anything is measured.
PRIOR_ACCEPTANCE = 0.5
#: Weight of the engine-wide estimate in a request's own (in proposals tried).
PRIOR_WEIGHT = 2.0
#: Weight of ``PRIOR_ACCEPTANCE`` in the engine-wide estimate, so that a few early
#: rejections do not switch speculation off for everyone.
GLOBAL_PRIOR_WEIGHT = 8.0


def expected_tokens(k: int, alpha: float) -> float:
    """Expected tokens from verifying ``k`` proposals, each accepted with probability
    ``alpha`` in [0, 1] independently, the run stopping at the first rejection (the
    target's own token always comes on top)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class CostCurve:
    """Seconds of a pass as a function of its size, from measurements.

    Sizes are bucketed by ``round(log2(size))``; each bucket keeps an exponential moving
    average of the sizes and seconds observed in it. ``estimate`` interpolates linearly
    between buckets (by their mean size), holds the smallest bucket's time below it, and
    extrapolates along the last segment above the largest.

    Args:
        smoothing: weight of a new observation in its bucket's averages (0, 1].
    """

    def __init__(self, smoothing: float = 0.2) -> None:
        self.smoothing = smoothing
        self._buckets: dict[int, list[float]] = {}  # bucket -> [mean size, mean seconds]

    @property
    def num_buckets(self) -> int:
        """Sizes measured (one per power of two)."""
        return len(self._buckets)

    def observe(self, size: int, seconds: float) -> None:
        """Record one pass of ``size`` (tokens or requests, >= 1) taking ``seconds``."""
        if size < 1 or not seconds >= 0:
            return
        b = round(math.log2(size))
        cur = self._buckets.get(b)
        if cur is None:
            self._buckets[b] = [float(size), seconds]
            return
        w = self.smoothing
        cur[0] += w * (size - cur[0])
        cur[1] += w * (seconds - cur[1])

    def estimate(self, size: float) -> float | None:
        """Seconds for a pass of ``size``; None before any measurement."""
        if not self._buckets:
            return None
        pts = sorted(self._buckets.values())
        if size <= pts[0][0] or len(pts) == 1:
            if len(pts) == 1:
                return pts[0][1] * max(size / pts[0][0], 1.0)
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if size <= x1:
                return y0 + (y1 - y0) * (size - x0) / max(x1 - x0, 1e-9)
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        slope = max((y1 - y0) / max(x1 - x0, 1e-9), 0.0)
        return y1 + slope * (size - x1)


class Acceptance:
    """Decayed counts of proposals accepted and proposals tried.

    A verification of ``k`` proposals with ``a`` accepted tried ``a + 1`` of them when
    ``a < k`` (the run stops at the first rejection) and ``k`` otherwise, so
    accepted / tried estimates the per-proposal acceptance probability.

    Args:
        decay: factor applied to both counts before each update (1: no forgetting).
    """

    def __init__(self, decay: float = 1.0) -> None:
        self.decay = decay
        self.accepted = 0.0
        self.tried = 0.0

    def update(self, proposed: int, accepted: int) -> None:
        """Record one verification of ``proposed`` proposals, ``accepted`` of them kept."""
        if proposed <= 0:
            return
        self.accepted = self.accepted * self.decay + accepted
        self.tried = self.tried * self.decay + accepted + (1 if accepted < proposed else 0)

    def rate(self, prior: float = PRIOR_ACCEPTANCE, prior_weight: float = 0.0) -> float:
        """Acceptance probability estimate, shrunk towards ``prior`` by ``prior_weight``
        pseudo-trials (``prior`` itself when nothing was measured)."""
        tried = self.tried + prior_weight
        if tried <= 0:
            return prior
        return (self.accepted + prior * prior_weight) / tried


class SpecController:
    """Chooses ``k`` per request per step, and the batch size above which not to speculate.

    Args:
        max_k: most proposals per request per step (``--num-speculative-tokens``).
        max_batch: batch size above which speculation is off; None: the measured
            break-even (``break_even``).
        max_running: the largest batch the scheduler runs (bounds the break-even search).
    """

    def __init__(self, max_k: int, max_batch: int | None, max_running: int) -> None:
        self.max_k = max_k
        self.max_batch = max_batch
        self.max_running = max_running
        self.target = CostCurve()  # seconds per target pass, by tokens in the pass
        self.draft = CostCurve()  # seconds per draft pass, by requests proposed for
        self.acceptance = Acceptance(decay=0.995)  # engine-wide, slowly forgetting
        self.break_even = max_running
        self._stale = 0  # observations since the break-even was computed
        self._num_buckets = 0  # measured cost buckets when it was computed

    @property
    def cutoff(self) -> int:
        """Largest decoding batch that speculates now (the break-even is recomputed here
        after new cost buckets or every 16 observations)."""
        if self.max_batch is not None:
            return self.max_batch
        buckets = self.target.num_buckets + self.draft.num_buckets
        if self._stale >= 16 or (self._stale and buckets != self._num_buckets):
            self.update_break_even()
        return self.break_even

    def observe_target(self, num_tokens: int, seconds: float) -> None:
        """A decode/verify pass of ``num_tokens`` tokens took ``seconds``."""
        self.target.observe(num_tokens, seconds)
        self._tick()

    def observe_draft(self, batch: int, max_k: int, seconds: float) -> None:
        """A draft round trip for ``batch`` requests, up to ``max_k`` proposals each."""
        if max_k > 0:
            self.draft.observe(batch, seconds / max_k)
            self._tick()

    def observe_verify(self, proposed: int, accepted: int) -> None:
        """A verification of ``proposed`` proposals kept ``accepted`` of them."""
        self.acceptance.update(proposed, accepted)
        self._tick()

    def gain(self, batch: int, k: int, alpha: float) -> float | None:
        """Tokens per second with ``k`` proposals over tokens per second without (module
        docstring); None before the target's costs are measured."""
        t1 = self.target.estimate(batch)
        tk = self.target.estimate(batch * (k + 1))
        if t1 is None or tk is None:
            return None
        d = self.draft.estimate(batch) or 0.0
        return expected_tokens(k, alpha) * t1 / max(tk + k * d, 1e-12)

    def choose_k(self, batch: int, alpha: float, cap: int, probe: bool = False) -> int:
        """Proposals for one request of a decoding batch of ``batch``: the ``k`` in
        ``1 .. min(cap, max_k)`` of highest gain, or 0 when speculation is off for this
        batch size or no ``k`` gains (a forced ``--speculative-max-batch`` keeps k >= 1).
        Before any measurement: the largest allowed ``k``. ``probe``: ignore the cutoff
        and the gain and propose at least one token — an occasional measurement, so that
        an estimate that turned speculation off can recover."""
        cap = min(cap, self.max_k)
        if cap <= 0 or (batch > self.cutoff and not probe):
            return 0
        best_k, best = cap, None
        for k in range(1, cap + 1):
            g = self.gain(batch, k, alpha)
            if g is None:
                return cap
            if best is None or g > best:
                best_k, best = k, g
        if best is not None and best <= 1.0 and self.max_batch is None and not probe:
            return 0
        return best_k

    def global_acceptance(self) -> float:
        """The engine-wide acceptance estimate (recent verifications, with a prior)."""
        return self.acceptance.rate(PRIOR_ACCEPTANCE, GLOBAL_PRIOR_WEIGHT)

    def update_break_even(self) -> int:
        """Recompute ``break_even`` from the current measurements and acceptance."""
        alpha = self.global_acceptance()
        be = 0
        for b in range(1, self.max_running + 1):
            gains = [self.gain(b, k, alpha) for k in range(1, self.max_k + 1)]
            if any(g is None for g in gains):
                be = self.max_running
                break
            if max(gains, default=0.0) <= 1.0:
                break
            be = b
        self.break_even = be
        self._stale = 0
        self._num_buckets = self.target.num_buckets + self.draft.num_buckets
        return be

    def _tick(self) -> None:
        self._stale += 1
