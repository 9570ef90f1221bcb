"""The portable attention backend: paged KV through
``torch.nn.functional.scaled_dot_product_attention`` (CPU or GPU), and the base the C++
and Triton backends build on (see ``houchu.model.attention.base``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.metadata import (
    MAX_BATCHED_QUERY,
    MAX_EXTEND_AS_DECODE,
    LayeredMeta,
    MultiQuery,
    PrefillSeq,
    TorchMeta,
)
from houchu.model.attention.window import (
    PLAIN,
    LayerAttention,
    binding_windows,
    sdpa,
    window_start,
)
from houchu.model.batch import StepBatch
from houchu.model.kv.pool import KVPool


class TorchSDPABackend(AttentionBackend):
    """Portable backend on ``torch.nn.functional.scaled_dot_product_attention`` (CPU/GPU).

    Sequences with one new token (decode) are batched: their pages are gathered into a
    padded ``[B, Hkv, L, D]`` tensor and attended in one SDPA call, with the G = H/Hkv
    query heads of a KV group laid along SDPA's query-length axis (so KV is never
    repeated) and a length mask. Sequences with several new tokens (prefill chunks) run
    one SDPA call each, causal with an offset of ``start_pos`` — except that two or more
    with a few new tokens after cached KV (speculative verification) share one padded
    call with a per-sequence causal mask.
    """

    name = "torch-sdpa"
    supports_static = True
    #: ``--deterministic``: every sequence, one new token or many, attends on the prefill
    #: path (one kernel for a prompt prefilled whole, in chunks, or ending in a one-token
    #: chunk, and for decode rows; the decode kernel and the batched verification call
    #: order a query's sums otherwise)
    one_kernel = False

    def prepare(
        self, batch: StepBatch, layers: tuple[LayerAttention, ...] = ()
    ) -> TorchMeta | LayeredMeta:
        """The step's indices and masks: a ``TorchMeta``, or, where a layer's window,
        scale or soft-cap changes this step, a ``LayeredMeta`` with one per window."""
        if not binding_windows(layers, batch.kv_lens):
            return self._prepare(batch, 0)
        windows = {s.window for s in layers}
        return LayeredMeta(layers, {w: self._prepare(batch, w) for w in windows})

    def _prepare(self, batch: StepBatch, window: int) -> TorchMeta:
        """Indices and masks of attention over each token's last ``window`` positions
        (0: all); only the pages holding them are read."""
        # a prompt's tokens (``StepBatch.prompt_seqs``) always attend on the prefill kernel:
        # the tail of a cached prompt then gets the bits it gets in a whole prefill
        one = [self.one_kernel or i in batch.prompt_seqs for i in range(batch.num_seqs)]
        decode = [i for i in range(batch.num_seqs) if batch.q_len(i) == 1 and not one[i]]
        most = 0 if window or self.one_kernel else MAX_EXTEND_AS_DECODE
        extend = [i for i in range(batch.num_seqs) if _short_extend(batch, i, most) and not one[i]]
        meta = TorchMeta(all_decode=len(decode) + len(extend) == batch.num_seqs)
        dev = batch.token_ids.device
        if window and any(batch.kv_lens[i] > window for i in decode):  # (no extend)
            meta.decode_rows = torch.tensor(
                [batch.q_starts[i] for i in decode], dtype=torch.int64, device=dev
            )
            self._window_decode(meta, batch, decode, window)
        elif decode or extend:  # every token of a short extend is a decode row
            _decode_rows(meta, batch, sorted(decode + extend))
        multi = [
            i
            for i in range(batch.num_seqs)
            if 1 < batch.q_len(i) <= MAX_BATCHED_QUERY
            and batch.start_pos[i] > 0
            and i not in extend
            and not one[i]
        ]
        if len(multi) > 1 and not self.one_kernel:
            meta.multi = self._multi_query(batch, multi, window)
        else:
            multi = []
        for i in range(batch.num_seqs):
            n = batch.q_len(i)
            if i in multi or i in extend or (n == 1 and not one[i]):
                continue
            meta.prefill.append(self._prefill_seq(batch, i, window))
        return meta

    @staticmethod
    def _prefill_seq(batch: StepBatch, i: int, window: int) -> PrefillSeq:
        """Sequence ``i``'s chunk: its keys from the first page its first query's window
        reaches, and its causal (and window) mask; None where plain causal."""
        dev, ps = batch.token_ids.device, batch.page_size
        start, kv_len = batch.start_pos[i], batch.kv_lens[i]
        base = window_start(start + 1, window) // ps * ps
        windowed = bool(window) and kv_len - window > base
        mask = None
        if start > 0 or windowed:
            q_pos = torch.arange(start, kv_len, device=dev)  # [n]
            k_pos = torch.arange(base, kv_len, device=dev)  # [L - base]
            mask = k_pos[None, :] <= q_pos[:, None]  # [n, L - base]
            if windowed:
                mask &= k_pos[None, :] > q_pos[:, None] - window
        return PrefillSeq(
            rows=(batch.q_starts[i], batch.q_starts[i + 1]),
            start=start,
            kv_len=kv_len,
            pages=batch.page_tables[i, base // ps : -(-kv_len // ps)],
            mask=mask,
            base=base,
            windowed=windowed,
        )

    @staticmethod
    def _window_decode(meta: TorchMeta, batch: StepBatch, rows: list[int], window: int) -> None:
        """Decode rows' pages from the page holding the first position of their window,
        with the lengths and window starts counted from that page."""
        ps, dev = batch.page_size, batch.token_ids.device
        tables = batch.page_tables.tolist()
        pages, lens, starts = [], [], []
        for i in rows:
            n = batch.kv_lens[i]
            lo = window_start(n, window)
            first = lo // ps
            pages.append(tables[i][first : -(-n // ps)])
            lens.append(n - first * ps)
            starts.append(lo - first * ps)
        width = max(len(p) for p in pages)
        padded = [p + [p[-1]] * (width - len(p)) for p in pages]  # padding is masked
        meta.decode_pages = torch.tensor(padded, dtype=torch.int64, device=dev)
        meta.decode_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        meta.decode_starts = torch.tensor(starts, dtype=torch.int32, device=dev)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pool: KVPool,
        batch: StepBatch,
        meta: TorchMeta | LayeredMeta,
    ) -> torch.Tensor:
        self.store(pool, layer, batch.slot_mapping, k, v)
        spec = PLAIN
        if isinstance(meta, LayeredMeta):
            spec = meta.layers[layer]
            meta = meta.metas[spec.window]
        if meta.all_decode:
            return self._decode(layer, q, pool, meta, spec)
        out = torch.empty_like(q)  # [T, H, D]
        for s in meta.prefill:
            a, b = s.rows
            if s.start == 0:
                ks, vs = k[a:b], v[a:b]  # [n, Hkv, D], identical to what the pool holds
            else:
                ks, vs = pool.gather(layer, s.pages, s.kv_len - s.base)  # [L - base, Hkv, D]
            out[a:b] = self._prefill(q[a:b], ks, vs, s, spec)
        if meta.decode_rows is not None:
            rows = meta.decode_rows
            out[rows] = self._decode(layer, q.index_select(0, rows), pool, meta, spec)
        if meta.multi is not None:
            m = meta.multi
            b, n = m.rows.shape
            kp, vp = pool.gather_padded(layer, m.pages)  # [B, L, Hkv, D] each
            qm = q.index_select(0, m.rows.reshape(-1)).view(b, n, *q.shape[1:])  # [B, n, H, D]
            o = sdpa(
                qm.transpose(1, 2),  # [B, H, n, D]
                kp.transpose(1, 2),  # [B, Hkv, L, D]
                vp.transpose(1, 2),  # [B, Hkv, L, D]
                m.mask,  # [B, 1, n, L]
                spec,
            )  # [B, H, n, D]
            out[m.rows[m.valid]] = o.transpose(1, 2)[m.valid]
        return out

    @staticmethod
    def _multi_query(batch: StepBatch, seqs: list[int], window: int = 0) -> MultiQuery:
        """Rows, pages and causal (and ``window``) masks of ``seqs`` (indices into the
        batch), batched."""
        dev = batch.token_ids.device
        n = max(batch.q_len(i) for i in seqs)
        n_pages = -(-max(batch.kv_lens[i] for i in seqs) // batch.page_size)
        # the pages from the one holding the earliest window's first position
        first = min(window_start(batch.start_pos[i] + 1, window) for i in seqs) // batch.page_size
        j = torch.arange(n, device=dev)  # [n]
        q_len = torch.tensor([batch.q_len(i) for i in seqs], device=dev)  # [B]
        q_first = torch.tensor([batch.q_starts[i] for i in seqs], device=dev)  # [B]
        start = torch.tensor([batch.start_pos[i] for i in seqs], device=dev)  # [B]
        last = torch.minimum(j[None, :], q_len[:, None] - 1)  # [B, n] padding repeats the last
        pos = start[:, None] + last  # [B, n] position of each query
        ps = batch.page_size
        span = torch.arange(first * ps, n_pages * ps, device=dev)  # [L] positions read
        idx = torch.tensor(seqs, dtype=torch.int64, device=dev)
        mask = span[None, None, :] <= pos[:, :, None]  # [B, n, L]
        if window:
            mask &= span[None, None, :] > pos[:, :, None] - window
        return MultiQuery(
            rows=q_first[:, None] + last,
            valid=j[None, :] < q_len[:, None],
            pages=batch.page_tables[idx, first:n_pages].contiguous(),
            mask=mask[:, None],
        )

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seq: PrefillSeq,
        spec: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Causal attention of one sequence's new tokens. q: ``[n, H, D]``; k, v:
        ``[L - base, Hkv, D]`` (its KV from position ``seq.base``, cached prefix first)
        -> ``[n, H, D]``."""
        o = sdpa(
            q.transpose(0, 1).unsqueeze(0),  # [1, H, n, D]
            k.transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
            v.transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
            seq.mask,
            spec,
            is_causal=seq.mask is None,
        )  # [1, H, n, D]
        return o[0].transpose(0, 1)

    @staticmethod
    def store(
        pool: KVPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write new K/V ``[T, Hkv, D]`` at ``slots`` ``[T]`` (the pool quantizes)."""
        pool.write(layer, slots, k, v)

    def decode_static(self, layer, q, k, v, pool, slots, block_table, seq_lens):  # noqa: ANN001
        """See ``AttentionBackend.decode_static``: gathers all ``max_pages`` pages of every
        row (fixed shapes, so more bytes than ``forward``'s decode path)."""
        self.store(pool, layer, slots, k, v)
        b, h, d = q.shape
        hkv = pool.num_kv_heads
        kp, vp = pool.gather_padded(layer, block_table.long())  # [B, L, Hkv, D] each
        span = torch.arange(kp.shape[1], device=q.device)  # [L]
        mask = (span[None, :] < seq_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
        o = F.scaled_dot_product_attention(
            q.reshape(b, hkv, h // hkv, d), kp.transpose(1, 2), vp.transpose(1, 2), attn_mask=mask
        )  # [B, Hkv, G, D]
        return o.reshape(b, h, d)

    def _decode(
        self,
        layer: int,
        q: torch.Tensor,
        pool: KVPool,
        meta: TorchMeta,
        spec: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Batched one-token attention. q: ``[B, H, D]`` -> ``[B, H, D]``."""
        b, h, d = q.shape
        hkv = pool.num_kv_heads
        kp, vp = pool.gather_padded(layer, meta.decode_pages)  # [B, L, Hkv, D] each
        o = sdpa(
            q.reshape(b, hkv, h // hkv, d),  # [B, Hkv, G, D]: the G query heads of each group
            kp.transpose(1, 2),  # [B, Hkv, L, D]
            vp.transpose(1, 2),  # [B, Hkv, L, D]
            meta.length_mask(kp.shape[1]),  # [B, 1, 1, L]
            spec,
        )  # [B, Hkv, G, D]
        return o.reshape(b, h, d)


def _short_extend(batch: StepBatch, i: int, most: int) -> bool:
    """Whether sequence ``i`` of ``batch`` is a short extend after cached KV (a
    speculative verification, a jump-forward chunk, the tail of a cached prompt): at
    most ``most`` new tokens, more than one, from a position past 0."""
    return 1 < batch.q_len(i) <= most and batch.start_pos[i] > 0


def _decode_rows(meta: TorchMeta, batch: StepBatch, seqs: list[int]) -> None:
    """Every new token of the sequences ``seqs`` (decodes and short extends) as a decode
    row of its own: token ``j`` of sequence ``i`` attends its sequence's pages up to its
    own position, ``kv_len = start_pos + j + 1`` (causal within the extend: the step
    stores every row's K/V before any row attends). A short extend then runs on the
    decode kernels (the fused CPU decode layers among them) instead of a prefill.

    Sets ``decode_rows`` ``[B]`` int64 (token rows, in step order), ``decode_pages``
    ``[B, n_pages]`` int64 and ``decode_lens`` ``[B]`` int32, B = the tokens of ``seqs``.
    """
    dev, ps = batch.token_ids.device, batch.page_size
    rows, owner, lens = [], [], []
    for i in seqs:
        for j in range(batch.q_len(i)):
            rows.append(batch.q_starts[i] + j)
            owner.append(i)
            lens.append(batch.start_pos[i] + j + 1)
    n_pages = -(-max(lens) // ps)
    idx = torch.tensor(owner, dtype=torch.int64, device=dev)  # [B]
    meta.decode_rows = torch.tensor(rows, dtype=torch.int64, device=dev)  # [B]
    meta.decode_pages = batch.page_tables[idx, :n_pages].contiguous()  # [B, n_pages]
    meta.decode_lens = torch.tensor(lens, dtype=torch.int32, device=dev)  # [B]
