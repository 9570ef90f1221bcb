"""Sliding-window attention in the backends against a dense reference: decode rows longer
than the window read only the window's pages (the C++ kernel's ``starts``, at every ISA
level; the torch path's gather), and prefill chunks read from their first window's page
and mask keys before each query's window (the C++ tiled and portable kernels' ``window``;
the torch path's mask), over plain and int8 pools."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from houchu.model.attention.metadata import LayeredMeta
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.attention.window import LayerAttention
from houchu.model.batch import build_batch
from houchu.runner.backends import make_backend
from houchu.transport.messages import SeqWork
from tests.support.cpu_kernels import make_pool

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level


def reference(q, pool, tables, starts, lens, window):
    """Dense attention of each row's new token(s) over its whole KV, window-masked.

    q: [T, H, D]; rows of sequence i are its positions starts[i] .. lens[i] - 1."""
    out, row = [], 0
    for table, start, n in zip(tables, starts, lens, strict=True):
        k, v = pool.gather(0, torch.tensor(table), n)  # [n, Hkv, D]
        pos = torch.arange(start, n)[:, None]
        key = torch.arange(n)[None, :]
        mask = (key <= pos) & (key > pos - window)  # [m, n]
        m = n - start
        o = F.scaled_dot_product_attention(
            q[row : row + m].transpose(0, 1)[None].float(),
            k.transpose(0, 1)[None].float(),
            v.transpose(0, 1)[None].float(),
            attn_mask=mask,
            enable_gqa=True,
        )
        out.append(o[0].transpose(0, 1))
        row += m
    return torch.cat(out)


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("ps", "h", "hkv", "d", "window", "work"),
    [
        # (start, new tokens) per sequence: decode rows past, at and within the window
        (4, 4, 2, 64, 8, [(20, 1), (8, 1), (5, 1), (30, 1)]),
        (16, 8, 2, 128, 13, [(40, 1), (70, 1)]),
        (8, 4, 4, 16, 9, [(25, 1), (3, 1)]),  # D = 16: the portable kernel
        # a prefill chunk longer than the window, and one after a cached prefix
        (4, 4, 2, 64, 8, [(0, 21), (11, 6)]),
        # the tiled kernel over several 64-key blocks, the first ones skipped
        (16, 4, 2, 64, 70, [(40, 150)]),
        (8, 6, 3, 128, 100, [(0, 130), (77, 20)]),
        (4, 4, 2, 48, 8, [(0, 19), (9, 7)]),  # D = 48: the portable prefill
    ],
)
def test_windowed_attention_matches_dense(kv_dtype, dtype, ps, h, hkv, d, window, work):
    pool = make_pool(kv_dtype, dtype, ps, hkv, d)
    g = torch.Generator().manual_seed(ps + d + window)
    kv = torch.randn(2, pool.num_tokens, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(pool.num_pages, generator=g).tolist()
    tables, items = [], []
    for i, (start, n) in enumerate(work):
        pages = -(-(start + n) // ps)
        table = perm[:pages]
        del perm[:pages]
        tables.append(table)
        items.append(
            SeqWork(rid=f"r{i}", token_ids=[1] * n, start_pos=start, page_table=table, sample=True)
        )
        # the cached prefix's K/V
        slots = torch.tensor([table[p // ps] * ps + p % ps for p in range(start)], dtype=torch.long)
        if start:
            pool.write(0, slots, kv[0, slots], kv[1, slots])
    batch = build_batch(
        items, page_size=ps, num_pages=pool.num_pages, max_context=999, vocab_size=2
    )
    t = batch.num_tokens
    q = torch.randn(t, h, d, generator=g).to(dtype)
    k_new = kv[0, batch.slot_mapping]  # [T, Hkv, D]
    v_new = kv[1, batch.slot_mapping]
    layers = (LayerAttention(window=window),)
    for name in ("torch", "cpu"):
        backend = make_backend(name)
        meta = backend.prepare(batch, layers)
        assert isinstance(meta, LayeredMeta)
        got = backend.forward(0, q, k_new, v_new, pool, batch, meta)  # writes the new K/V
        want = reference(q, pool, tables, batch.start_pos, batch.kv_lens, window)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        if kv_dtype == "int8" and any(s == 0 and n > 1 for s, n in work):
            tol = 5e-2  # a prompt's own chunk attends its unquantized K/V, as the model does
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    if all(n == 1 for _, n in work):  # decode: only the windows' pages are read
        m = TorchSDPABackend()._prepare(batch, window)
        for i, n in enumerate(batch.kv_lens):
            first = max(0, n - window) // ps
            assert m.decode_lens[i] == n - first * ps
            assert m.decode_starts[i] == max(0, n - window) - first * ps
