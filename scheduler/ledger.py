"""The scheduler's share of the lever ledger: what its levers saved and spent, measured.

Levers and their units (docs/architecture.md, "The lever ledger"):

| lever | verb | saved | spent |
|---|---|---|---|
| radix_prefix_cache | skip | prefill tokens not computed; their FLOPs | KV pages held by the tree |
| parallel_sampling | skip | prefill tokens a choice of ``n > 1`` took from another's (and FLOPs) | prompt tokens it computed itself |
| paged_kv | occupy_less | KV bytes not reserved vs. max-length reservation | page-table entries |
| continuous_batching | fill | forward passes shared (requests per step - 1) | queueing delay (not measured) |
| chunked_prefill | fill | prefill tokens moved out of one long step | extra steps |
| sliding_window_pages | occupy_less | KV bytes of pages released outside every window | pages released (re-read never) |

FLOPs of a skipped prefill token at position ``p``: ``2 * N`` for the matmuls (``N``
non-embedding parameters; Kaplan et al. 2020, "Scaling Laws", the forward-pass count)
plus ``4 * L * H * d * p`` for attention (QK^T and AV over ``p`` earlier positions, with
``L`` layers, ``H`` query heads of size ``d``).
"""

from __future__ import annotations

import time
from collections import deque

from houchu.scheduler.request import Request
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.messages import RunnerInfo
from houchu.transport.stats import LedgerStats
from houchu.transport.telemetry import LeverSample


class SchedulerLedger:
    """Counters of the scheduler's levers, in total and per request.

    Args:
        runner: model size and KV geometry, for FLOPs and bytes.
    """

    def __init__(self, runner: RunnerInfo) -> None:
        self.runner = runner
        self.prefix_tokens_reused = 0
        self.prefix_flops_saved = 0.0
        self.pages_shared = 0
        self.parallel_tokens_shared = 0
        self.prompt_tokens_admitted = 0
        self.forward_passes = 0
        self.tokens_computed = 0
        self.requests_stepped = 0
        self.chunked_tokens = 0
        self.extra_chunk_steps = 0
        self.recent_max_itl: deque[tuple[float, float]] = deque(maxlen=512)  # (t, gap s)
        self.max_itl_s = 0.0

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill positions ``start .. end - 1`` (see module docstring)."""
        r = self.runner
        n = end - start
        attn_pairs = (start + end - 1) * n / 2  # sum of p over the positions
        return 2.0 * r.num_nonembed_params * n + r.attn_flops_per_pair * attn_pairs

    def on_admitted(self, req: Request) -> list[LeverSample]:
        """A request's first admission: account its reused prefix (tokens, and the FLOPs
        those tokens would have cost). A choice of ``n > 1`` that started from another
        choice's prompt pages (``Request.shares_prefill``) reports them as the
        ``parallel_sampling`` lever, spending the prompt tokens it still computed."""
        self.prompt_tokens_admitted += req.num_prompt
        if req.cached_tokens == 0:
            return []
        flops = self.prefill_flops(0, req.cached_tokens)
        self.prefix_tokens_reused += req.cached_tokens
        self.prefix_flops_saved += flops
        pages = req.cached_tokens // self.runner.page_size
        self.pages_shared += pages
        now = time.time()
        if req.shares_prefill:
            self.parallel_tokens_shared += req.cached_tokens
            rest = float(req.num_prompt - req.cached_tokens)
            par, tok = Lever.PARALLEL_SAMPLING, Unit.TOKENS
            return [
                LeverSample(par, Verb.SKIP, float(req.cached_tokens), tok, rest, tok, now, req.rid),
                LeverSample(par, Verb.SKIP, flops, Unit.FLOPS, 0.0, tok, now, req.rid),
            ]
        return [
            LeverSample(
                lever=Lever.RADIX_PREFIX_CACHE,
                verb=Verb.SKIP,
                saved=float(req.cached_tokens),
                saved_unit=Unit.TOKENS,
                spent=float(pages),
                spent_unit=Unit.PAGES,
                t=now,
                rid=req.rid,
            ),
            LeverSample(
                Lever.RADIX_PREFIX_CACHE,
                Verb.SKIP,
                flops,
                Unit.FLOPS,
                0.0,
                Unit.PAGES,
                now,
                req.rid,
            ),
        ]

    def on_step(self, batch: list[Request], num_tokens: int, now: float) -> list[LeverSample]:
        """One forward pass of ``batch`` computing ``num_tokens`` tokens: the continuous
        batching sample (none for a batch of one)."""
        self.forward_passes += 1
        self.tokens_computed += num_tokens
        self.requests_stepped += len(batch)
        if len(batch) <= 1:
            return []
        return [
            LeverSample(
                lever=Lever.CONTINUOUS_BATCHING,
                verb=Verb.FILL,
                saved=float(len(batch) - 1),
                saved_unit=Unit.FORWARD_PASSES,
                spent=0.0,
                spent_unit=Unit.NONE,  # queueing delay: not measured as a lever
                t=now,
            )
        ]

    def on_token(self, req: Request, now: float) -> None:
        """A decode token of ``req`` arrived at ``now`` (seconds): track the longest gap."""
        if req.last_token_time:
            gap = now - req.last_token_time
            req.max_itl_s = max(req.max_itl_s, gap)
            self.recent_max_itl.append((now, gap))
            self.max_itl_s = max(self.max_itl_s, gap)
        req.last_token_time = now

    def on_finished(self, req: Request, kv_bytes_held: int) -> list[LeverSample]:
        """Per-request samples when ``req`` leaves: paged KV vs max-length reservation,
        chunked prefill."""
        r = self.runner
        now = time.time()
        reserved_max = req.max_length(r.max_context) * r.kv_bytes_per_token
        out = [
            LeverSample(
                lever=Lever.PAGED_KV,
                verb=Verb.OCCUPY_LESS,
                saved=float(max(reserved_max - kv_bytes_held, 0)),
                saved_unit=Unit.BYTES,
                spent=float(kv_bytes_held // max(r.page_size * r.kv_bytes_per_token, 1)),
                spent_unit=Unit.PAGE_TABLE_ENTRIES,
                t=now,
                rid=req.rid,
            )
        ]
        if req.window_pages_released:
            pages = req.window_pages_released
            out.append(
                LeverSample(
                    lever=Lever.SLIDING_WINDOW_PAGES,
                    verb=Verb.OCCUPY_LESS,
                    saved=float(pages * r.page_size * r.kv_bytes_per_token),
                    saved_unit=Unit.BYTES,
                    spent=float(pages),
                    spent_unit=Unit.PAGES,
                    t=now,
                    rid=req.rid,
                )
            )
        if req.num_chunks > 1:
            chunked = req.num_prompt - req.cached_tokens
            self.chunked_tokens += chunked
            self.extra_chunk_steps += req.num_chunks - 1
            out.append(
                LeverSample(
                    lever=Lever.CHUNKED_PREFILL,
                    verb=Verb.FILL,
                    saved=float(chunked),
                    saved_unit=Unit.TOKENS,
                    spent=float(req.num_chunks - 1),
                    spent_unit=Unit.STEPS,
                    t=now,
                    rid=req.rid,
                )
            )
        return out

    def window_max_itl(self, window_s: float = 60.0) -> float:
        """Longest inter-token gap of any stream in the last ``window_s`` seconds."""
        cutoff = time.time() - window_s
        return max((g for t, g in self.recent_max_itl if t >= cutoff), default=0.0)

    def stats(self) -> LedgerStats:
        return LedgerStats(
            prefix_tokens_reused=self.prefix_tokens_reused,
            prefix_tokens_queried=self.prompt_tokens_admitted,
            prefix_hit_rate=self.prefix_tokens_reused / max(self.prompt_tokens_admitted, 1),
            prefix_flops_saved=self.prefix_flops_saved,
            pages_shared=self.pages_shared,
            parallel_sampling_tokens_shared=self.parallel_tokens_shared,
            forward_passes=self.forward_passes,
            tokens_per_forward=self.tokens_computed / max(self.forward_passes, 1),
            requests_per_forward=self.requests_stepped / max(self.forward_passes, 1),
            chunked_prefill_tokens=self.chunked_tokens,
            chunked_prefill_extra_steps=self.extra_chunk_steps,
            max_itl_s=self.max_itl_s,
            max_itl_60s=self.window_max_itl(),
        )
