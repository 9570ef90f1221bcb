"""Length distributions for workloads: ``256``, ``uniform:64:512``, ``normal:256:64``,
``exp:256``.

A distribution draws token counts (integers >= 1) from a :class:`random.Random`, so a
workload built with the same seed draws the same lengths.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthDist:
    """A distribution of lengths in tokens.

    Attributes:
        kind: ``fixed``, ``uniform``, ``normal`` or ``exp``.
        a: the fixed value, the uniform low end, the normal mean or the exponential mean.
        b: the uniform high end or the normal standard deviation (0 otherwise).
    """

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        """One length in tokens, at least 1."""
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            v = rng.gauss(self.a, self.b)
        else:
            v = rng.expovariate(1.0 / self.a)
        return max(1, int(round(v)))

    @property
    def mean(self) -> float:
        """The distribution's mean in tokens (before clamping to >= 1)."""
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "exp":
            return f"exp:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_dist(text: str) -> LengthDist:
    """Parse a length distribution.

    Forms: ``N`` (always N), ``uniform:LO:HI`` (integers, both ends included),
    ``normal:MEAN:STD``, ``exp:MEAN``. Values are tokens.

    Raises:
        ValueError: an unknown form or a non-positive value.
    """
    parts = text.strip().split(":")
    try:
        nums = [float(p) for p in parts[1:]] if len(parts) > 1 else [float(parts[0])]
    except ValueError:
        raise ValueError(f"bad length distribution {text!r}: numbers expected") from None
    kind = parts[0] if len(parts) > 1 else "fixed"
    arity = {"fixed": 1, "uniform": 2, "normal": 2, "exp": 1}
    if kind not in arity or len(nums) != arity[kind]:
        raise ValueError(
            f"bad length distribution {text!r}: use N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN"
        )
    if (
        nums[0] <= 0
        or (kind == "uniform" and nums[1] < nums[0])
        or (kind == "normal" and nums[1] < 0)
    ):
        raise ValueError(f"bad length distribution {text!r}: values must be positive, LO <= HI")
    return LengthDist(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)
