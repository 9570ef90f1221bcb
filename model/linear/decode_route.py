"""The decode path per batch bucket that ``houchu.runner.autotune`` measured, and how a
step of some number of rows finds its path."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeRoute:
    """Which path a decode step of ``rows`` rows takes.

    Attributes:
        table: bucket (rows) -> path; a step of ``rows`` rows takes the path of the
            smallest bucket >= rows.
        prefill: the path of steps above the largest bucket, or None (the layers'
            rules).
    """

    table: dict[int, str]
    prefill: str | None = None

    def __post_init__(self) -> None:
        # every quantized linear asks on every step: the buckets sorted once
        self._order = sorted(self.table.items())

    def path_for(self, rows: int) -> str | None:
        """The path for a step of ``rows`` rows, or None (no choice made for it)."""
        for b, path in self._order:
            if rows <= b:
                return path
        return self.prefill

    def describe(
        self,
        times: dict[int, dict[str, float]] | None = None,
        prefill_times: dict[str, float] | None = None,
    ) -> str:
        """E.g. "b<=1 fused 2.4 ms (gemv 3.1, torch 9.0); b<=32 dense 20.1 ms (...);
        prefill gemv-a8 40.2 ms (dense 90.3)": consecutive buckets with the same path
        merged when no times are given, times in milliseconds."""
        parts, buckets = [], sorted(self.table)
        for i, b in enumerate(buckets):
            if i + 1 < len(buckets) and self.table[buckets[i + 1]] == self.table[b] and not times:
                continue
            path = self.table[b]
            text = f"b<={b} {path}"
            if times and b in times:
                others = ", ".join(f"{p} {t * 1e3:.1f}" for p, t in times[b].items() if p != path)
                text += f" {times[b][path] * 1e3:.1f} ms" + (f" ({others})" if others else "")
            parts.append(text)
        if self.prefill is not None:
            text = f"prefill {self.prefill}"
            if prefill_times and self.prefill in prefill_times:
                others = ", ".join(
                    f"{p} {t * 1e3:.1f}" for p, t in prefill_times.items() if p != self.prefill
                )
                text += f" {prefill_times[self.prefill] * 1e3:.1f} ms"
                text += f" ({others})" if others else ""
            parts.append(text)
        return "; ".join(parts)
