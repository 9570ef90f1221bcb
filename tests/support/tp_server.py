"""A tiny model served with tensor parallel 2 (gloo), beside its transformers twin."""

from __future__ import annotations

import aiohttp
import torch

from houchu.devtools.tiny_models import make_tiny_llama, write_tiny_tokenizer
from tests.support.server import start_server, stop_server


def serve_tiny_tp2(tmp_path_factory, name: str, *flags: str):
    """A tiny random Llama (heads that divide by 2) served at ``--tensor-parallel-size 2``
    with ``flags``, small pages and chunked prefill; yields (server, its transformers
    twin) and stops the server."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_llama(tmp_path_factory.mktemp(name), seed=7, intermediate_size=128)
    write_tiny_tokenizer(path, 128)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    db = tmp_path_factory.mktemp(f"{name}_db") / "houchu.db"
    srv = start_server(
        path,
        *("--tensor-parallel-size", "2", *flags),
        *("--page-size", "4", "--num-pages", "256", "--chunked-prefill-size", "8"),
        *("--max-batch-tokens", "32", "--db-url", f"sqlite:///{db}"),
    )
    yield srv, hf
    assert stop_server(srv) == 0


async def get_json_ok(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return await r.json()
