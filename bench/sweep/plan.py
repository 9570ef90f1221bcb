"""What a lever sweep measures: the configurations, the load levels, the repeats.

A configuration is a set of levers that are on; every other swept lever is off. The plan
holds the baseline (all off), each lever alone, and the pairs asked for (by default the
interacting ones of :data:`houchu.bench.sweep.levers.INTERACTING_PAIRS` among the swept
levers). Each configuration runs on fresh servers, one after the other, at every load
level, ``repeats`` times. A lever that cannot apply here is kept in the plan's
``not_applicable`` with the reason, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from houchu.bench.sweep.levers import INTERACTING_PAIRS, Lever, Machine, can_pair, lever


@dataclass(frozen=True)
class Load:
    """One load level: ``concurrency`` sessions in flight (closed loop) or a Poisson
    ``rate`` in requests per second."""

    kind: str  # "concurrency" or "rate"
    value: float

    @property
    def label(self) -> str:
        """``c=4`` or ``r=2``."""
        return f"{'c' if self.kind == 'concurrency' else 'r'}={self.value:g}"


DEFAULTS = "defaults"  # the configuration of ``houchu serve`` with no lever flags


@dataclass(frozen=True)
class Config:
    """A set of levers switched on (the others of the sweep off), or with ``defaults``
    houchu's own defaults: no lever flag at all (the reference a recommendation is
    judged against)."""

    on: frozenset[str]
    defaults: bool = False

    @property
    def name(self) -> str:
        """``baseline``, ``int4``, ``int4+int8-kv`` (sorted) or ``defaults``."""
        if self.defaults:
            return DEFAULTS
        return "+".join(sorted(self.on)) or "baseline"


def merge_flags(chunks: list[tuple[str, ...]]) -> list[str]:
    """Flags of several levers as one ``houchu serve`` argument list: a flag set twice
    (two levers both off that share ``--quantization none``) appears once, with its
    last value; a flag's value is the token after it unless that starts with ``--``.

    Raises:
        ValueError: a value without a flag before it.
    """
    out: dict[str, str | None] = {}
    for chunk in chunks:
        i = 0
        while i < len(chunk):
            flag = chunk[i]
            if not flag.startswith("--"):
                raise ValueError(f"value {flag!r} without a flag in {chunk}")
            has_value = i + 1 < len(chunk) and not chunk[i + 1].startswith("--")
            out[flag] = chunk[i + 1] if has_value else None
            i += 2 if has_value else 1
    args: list[str] = []
    for flag, value in out.items():
        args += [flag] if value is None else [flag, value]
    return args


@dataclass
class SweepPlan:
    """The configurations, loads and repeats of a sweep.

    Attributes:
        levers: the swept levers that apply here, in the order asked.
        not_applicable: ``{lever name: reason}`` for those that do not.
        pairs: the pairs measured, each ``(a, b)`` in ``levers`` order.
        loads: the load levels, lowest first.
        repeats: runs of each (configuration, load).
        machine: what applicability was judged on.
        skipped_pairs: ``{"a+b": reason}`` for the pairs asked for and not measured.
        defaults: whether houchu's defaults (no lever flags) are measured too.
    """

    levers: list[Lever]
    not_applicable: dict[str, str]
    pairs: list[tuple[str, str]]
    loads: list[Load]
    repeats: int
    machine: Machine
    skipped_pairs: dict[str, str] = field(default_factory=dict)
    defaults: bool = True

    def configs(self) -> list[Config]:
        """Baseline, houchu's defaults, then each lever alone, then each pair; a lever
        that requires others (``Lever.requires``) is measured against them alone, so that
        configuration is added where the sweep has no such config."""
        out = [Config(frozenset())]
        out += [Config(frozenset(), defaults=True)] if self.defaults else []
        out += [Config(frozenset({lv.name})) for lv in self.levers]
        out += [Config(frozenset(p)) for p in self.pairs]
        for lv in self.levers:
            ref = self.reference(lv.name)
            if ref not in out:
                out.insert(2 if self.defaults else 1, ref)
        return out

    def reference(self, name: str) -> Config:
        """The configuration lever ``name``'s gains are measured against: the baseline,
        or the swept levers it requires alone (one not swept is on in the baseline)."""
        swept = {lv.name for lv in self.levers}
        return Config(frozenset(self.lever(name).requires) & swept)

    def flags(self, config: Config) -> list[str]:
        """``houchu serve`` flags of a configuration: each swept lever's on or off flags
        (on also where a lever that is on requires it), in the levers' order; where a
        lever that is on and one that is off set the same flag (int4 on, int8 off: both
        ``--quantization``), the one that is on sets its value. houchu's defaults: none."""
        if config.defaults:
            return []
        on = set(config.on)
        for name in config.on:
            on |= set(lever(name).requires)
        chunks = [lv.flags(lv.name in on, self.machine) for lv in self.levers]
        return merge_flags(
            chunks + [lv.flags(True, self.machine) for lv in self.levers if lv.name in on]
        )

    def lever(self, name: str) -> Lever:
        """A swept lever by name."""
        return next(lv for lv in self.levers if lv.name == name)


def parse_loads(concurrency: str | None, rates: str | None) -> list[Load]:
    """Load levels from ``--concurrency 1,4,16`` or ``--request-rates 0.5,1,2``.

    Raises:
        ValueError: both or neither given, a value not positive, or not a number.
    """
    if (concurrency is None) == (rates is None):
        raise ValueError("give load levels as --concurrency LIST or --request-rates LIST (one)")
    kind, text = ("concurrency", concurrency) if concurrency is not None else ("rate", rates)
    assert text is not None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"load levels must be comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"load levels must be positive, got {text!r}")
    if kind == "concurrency" and any(v != int(v) for v in values):
        raise ValueError(f"concurrency levels must be whole numbers, got {text!r}")
    return [Load(kind, v) for v in sorted(set(values))]


def build_plan(
    names: list[str],
    pairs: str,
    loads: list[Load],
    repeats: int,
    machine: Machine,
    defaults: bool = True,
) -> SweepPlan:
    """The plan for levers ``names``.

    Args:
        names: lever names (``houchu.bench.sweep.levers.LEVERS``).
        pairs: ``interacting`` (the table's pairs among these levers), ``all`` (every
            pair that can be on together), ``none``, or ``a+b,c+d``.
        loads: load levels.
        repeats: runs per (configuration, load), at least 1.
        machine: decides which levers apply.
        defaults: measure houchu's defaults (``houchu serve`` with no lever flag) too.

    Raises:
        ValueError: an unknown lever or pair, a lever named twice, no lever, repeats < 1.
    """
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if not names:
        raise ValueError("name at least one lever (--levers a,b)")
    if len(set(names)) != len(names):
        raise ValueError(f"a lever is named twice in {','.join(names)}")
    asked = [lever(n) for n in names]
    na = {lv.name: why for lv in asked if (why := lv.applicable(machine)) is not None}
    levers = [lv for lv in asked if lv.name not in na]
    by = {lv.name: lv for lv in levers}
    skipped: dict[str, str] = {}
    if pairs == "none":
        wanted: list[tuple[str, str]] = []
    elif pairs == "all":
        wanted = [(a.name, b.name) for a, b in combinations(levers, 2)]
    elif pairs == "interacting":
        wanted = [p for p in INTERACTING_PAIRS if p[0] in by and p[1] in by]
    else:
        wanted = []
        for item in pairs.split(","):
            a, sep, b = item.strip().partition("+")
            if not sep or not a or not b:
                raise ValueError(f"a pair is written a+b, got {item!r}")
            for n in (a, b):
                if n not in names:
                    raise ValueError(f"pair {item!r}: {n} is not among --levers")
            wanted.append((a, b))
    order = {lv.name: i for i, lv in enumerate(levers)}
    out: list[tuple[str, str]] = []
    for a, b in wanted:
        key = f"{a}+{b}"
        if a in na or b in na:
            skipped[key] = f"{a if a in na else b} is not applicable here"
        elif b in by[a].requires or a in by[b].requires:
            need, has = (a, b) if b in by[a].requires else (b, a)
            skipped[key] = f"{need} runs with {has} on: its gains are measured against {has} alone"
        elif not can_pair(by[a], by[b]):
            skipped[key] = "they set the same flag: they cannot be on together"
        else:
            pair = (a, b) if order[a] < order[b] else (b, a)
            if pair not in out:
                out.append(pair)
    return SweepPlan(levers, na, out, loads, repeats, machine, skipped, defaults)
