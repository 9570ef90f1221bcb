"""N-gram prompt lookup: propose what followed the last time the sequence's most recent
tokens appeared in it (Saxena 2023, "Prompt Lookup Decoding"; vLLM's n-gram proposer).

No model, no KV: it pays on outputs that repeat their input (code edits, summaries,
extraction) and proposes nothing when there is no match.
"""

from __future__ import annotations


class NgramIndex:
    """One sequence's tokens and where each of its n-grams last occurred.

    ``_next[g]`` is the position right after the most recent occurrence of n-gram ``g``
    that has at least one token after it — the sequence's own suffix is therefore never
    its own match. Appending a token costs ``max_n - min_n + 1`` dict updates.

    Args:
        min_n: shortest n-gram to match (>= 1).
        max_n: longest n-gram to match (>= min_n); longer matches are tried first.
    Raises:
        ValueError: bad bounds.
    """

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, ids: list[int]) -> None:
        """Append ``ids`` to the sequence."""
        toks = self.tokens
        for t in ids:
            i = len(toks)  # position of t: every n-gram ending at i - 1 is followed by it
            for n in range(self.min_n, min(self.max_n, i) + 1):
                self._next[tuple(toks[i - n : i])] = i
            toks.append(t)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (rebuilds the index when anything is cut)."""
        if length >= len(self.tokens):
            return
        kept = self.tokens[:length]
        self.tokens, self._next = [], {}
        self.extend(kept)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        matching suffix n-gram; empty when none matches."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            start = self._next.get(tuple(toks[len(toks) - n :]))
            if start is not None:
                return toks[start : start + k]
        return []
