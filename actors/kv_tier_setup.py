"""Launcher-side set-up of the KV tiers: size the host slots, fingerprint the model, and
create the shared host pool before the actors start."""

from __future__ import annotations

import os

from houchu.cache_tiers.host_pool import HostPool
from houchu.cache_tiers.page_hash import model_fingerprint
from houchu.options.runner_options import RunnerOptions
from houchu.options.serve_config import ServeConfig


def prepare_kv_tiers(config: ServeConfig) -> tuple[ServeConfig, HostPool]:
    """Create the host pool and return the config with its name, pages, slot size and the
    model fingerprint filled in (``config.launch``).

    A slot holds one device page exactly: ``houchu.model.kv.page_pool.kv_page_bytes``
    (bytes; K and V over all layers at ``--kv-cache-dtype``, its float16 scales included
    when quantized; an MLA model's page of latents in the model dtype), with the dtype and
    page size the runner resolves from "auto" on the same device (``houchu.runner.choices``:
    bf16 and 256-token pages for flash-attn on CUDA). ``--host-kv-mb`` buys as many slots
    as it holds such pages.

    Raises:
        ModelLoadError: the model's configuration cannot be read.
    """
    import torch

    from houchu.model.config.core import mla_of
    from houchu.model.config.load import load_model_config
    from houchu.model.kv.page_pool import kv_page_bytes

    tiers = config.kv_tiers
    m = load_model_config(config.model)
    r = resolved_runner_options(config.runner, m.is_mla)
    dtype = getattr(torch, r.dtype)  # resolved: "float32", "bfloat16" or "float16"
    slot_bytes = kv_page_bytes(m, r.page_size, dtype, r.kv_cache_dtype)
    layout = (
        f"llama L{m.num_layers} kv{m.num_kv_heads} d{m.head_dim} ps{r.page_size} "
        f"{r.dtype} kv:{r.kv_cache_dtype}"
    )
    if m.is_mla:  # a page of latents: [c, k_pe] per token and layer
        mla = mla_of(m)
        layout += f" mla{mla.kv_lora_rank}+{mla.qk_rope_head_dim}"
    fingerprint = model_fingerprint(config.model, layout)
    name = f"houchu-kv-{os.getpid()}"
    pages = tiers.host_kv_pages or max(tiers.host_kv_bytes // slot_bytes, 1)
    pool = HostPool(name, pages, slot_bytes, create=True)
    config = config.with_launch(
        host_pool_pages=pages,
        host_pool_name=name,
        host_slot_bytes=slot_bytes,
        kv_fingerprint=fingerprint.hex(),
    )
    return config, pool


def resolved_runner_options(runner: RunnerOptions, mla: bool) -> RunnerOptions:
    """``runner`` with its dtype and page size as the runner will resolve them on the
    device ``--device`` names here (``resolve_dtype``, ``resolve_attention``)."""
    import torch

    from houchu.model.device import resolve_device
    from houchu.runner.choices import resolve_attention, resolve_dtype

    device = torch.device(resolve_device(runner.device))
    r, _ = resolve_dtype(runner, device)
    return resolve_attention(r, device, mla)[0]
