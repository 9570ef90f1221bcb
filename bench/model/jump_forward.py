"""Structured-output jump-forward benchmark: forward passes and wall time of a
JSON-schema request whose keys are long and fixed, with ``--jump-forward on`` and
``off``.

Starts two servers on the same model and flags (``houchu serve``'s defaults unless
``--serve-flags`` says otherwise), then takes turns between them for ``--rounds`` rounds
(so a drifting machine load hits both alike). Each round sends one greedy chat request
whose ``response_format`` is ``SCHEMA`` (six required properties with long names) and
reads, from the server's ``/stats`` before and after, the steps the runner ran for it
(``num_steps``) and the tokens the grammar forced (``jump_forward_tokens``). Prints the
medians per side: steps, wall seconds, completion tokens, tokens forced, and whether
every reply validated against the schema. Run::

    python -m houchu.bench.model.jump_forward [--model PATH] [--rounds 3]
        [--max-tokens 256] [--serve-flags ""]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema

from houchu.bench.servers import running_server

#: Long, fixed keys: the text a grammar forces between the values the model writes.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer_full_legal_name": {"type": "string", "maxLength": 24},
        "customer_primary_shipping_address": {"type": "string", "maxLength": 40},
        "order_total_amount_in_euros": {"type": "integer", "minimum": 0},
        "is_express_delivery_requested": {"type": "boolean"},
        "preferred_delivery_time_window": {"enum": ["morning", "afternoon", "evening"]},
        "number_of_items_in_the_order": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": [
        "customer_full_legal_name",
        "customer_primary_shipping_address",
        "order_total_amount_in_euros",
        "is_express_delivery_requested",
        "preferred_delivery_time_window",
        "number_of_items_in_the_order",
    ],
    "additionalProperties": False,
}
ORDER_PROMPT = (
    "Write the order of Ada Lovelace, 3 books for 42 euros, to 12 St James's Square, London."
)


async def _stats(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(f"{base}/stats") as r:
        return await r.json()


async def one_request(base: str, max_tokens: int) -> dict[str, float]:
    """One greedy constrained request: its steps, wall seconds, completion tokens,
    forced tokens, and 1.0 when the reply validates against ``SCHEMA``."""
    body = {
        "messages": [{"role": "user", "content": ORDER_PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "order", "schema": SCHEMA},
        },
    }
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/v1/models") as r:
            body["model"] = (await r.json())["data"][0]["id"]
        before = await _stats(s, base)
        t0 = time.perf_counter()
        async with s.post(f"{base}/v1/chat/completions", json=body) as r:
            reply = await r.json()
        wall = time.perf_counter() - t0
        after = await _stats(s, base)
    try:
        jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), SCHEMA)
        valid = 1.0
    except (ValueError, KeyError, jsonschema.ValidationError):
        valid = 0.0
    return {
        "steps": after["num_steps"] - before["num_steps"],
        "wall_s": wall,
        "tokens": reply.get("usage", {}).get("completion_tokens", 0),
        "forced": after.get("jump_forward_tokens", 0) - before.get("jump_forward_tokens", 0),
        "valid": valid,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--serve-flags", default="", help="flags of both servers")
    args = ap.parse_args()
    if args.rounds < 1 or args.max_tokens < 1:
        ap.error("--rounds and --max-tokens must be >= 1")
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    flags = shlex.split(args.serve_flags)
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with (
        running_server(model, *flags, "--jump-forward", "on") as on,
        running_server(model, *flags, "--jump-forward", "off") as off,
    ):
        urls = {"on": on, "off": off}
        for url in urls.values():  # warm-up: the grammar's tokenizer, first steps
            asyncio.run(one_request(_http(url), 16))
        for _ in range(args.rounds):
            for side, url in urls.items():
                runs[side].append(asyncio.run(one_request(_http(url), args.max_tokens)))
    print(f"jump-forward, JSON schema with long fixed keys, {args.rounds} rounds (medians)")
    print(f"{'':>5} {'steps':>6} {'wall s':>7} {'tokens':>7} {'forced':>7} {'valid':>6}")
    for side, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        ok = all(r["valid"] for r in rs)
        print(
            f"{side:>5} {med['steps']:>6.0f} {med['wall_s']:>7.2f} {med['tokens']:>7.0f} "
            f"{med['forced']:>7.0f} {str(ok):>6}"
        )


def _http(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws")


if __name__ == "__main__":
    main()
