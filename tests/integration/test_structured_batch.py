"""Constrained requests inside a batch of free-text requests, with jump-forward on (the
default), through the official openai client on the real model: the free requests'
greedy output is identical to the same requests without the constrained ones beside
them.

The constrained requests' schema holds a long constant, so jump-forward forces 140-odd
tokens at once (the test checks it did), fed as a catch-up chunk while the free requests
decode (their 32 tokens outlast the constrained requests' prefill and first token): the
catch-up tokens run in a pass of their own (``houchu.model.grammar.catch_up``), the free rows in
the pass they would be in without jump-forward. ``tests/integration/test_jump_forward_batch.py``
pins a decode route where the extra rows would change the free rows' path and checks
their log-probabilities bit for bit; served, other requests joining a batch may move the
free rows' floats a little (its attention split between threads, its step's kernels),
so this test compares their text, as a client sees it.

The free prompts run once first, so that every run after hits the prefix cache alike
(a first run prefills whole prompts, the later ones only their last tokens).
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from openai import OpenAI

from tests.support.server import Server

pytestmark = pytest.mark.slow

NOTE = (
    "Every order ships from the central warehouse within two business days, is tracked "
    "from door to door, and may be returned within thirty days of delivery for a full "
    "refund, provided that the items are unused, in their original packaging, and "
    "accompanied by the receipt that came with them when they were first delivered. "
    "Customers who live outside the country pay the return shipping themselves, unless "
    "the items arrived damaged, in which case we send a prepaid label by email within "
    "one business day of hearing from them, and the refund follows the inspection. "
    "Gift cards, opened software and perishable goods cannot be returned, and orders "
    "placed during a sale are refunded at the price that was actually paid for them."
)
SCHEMA = {
    "type": "object",
    "properties": {"policy": {"const": NOTE}, "items": {"type": "integer", "maximum": 99}},
    "required": ["policy", "items"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
PROMPTS = ["Name three rivers.", "Write a haiku about rain.", "What is 2+2?"]


def _stats(server: Server) -> dict:
    with urllib.request.urlopen(f"{server.url}/stats", timeout=10) as r:
        return json.load(r)


def test_free_requests_unchanged_beside_constrained_ones(server: Server) -> None:
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id

    def free(p: str) -> str:
        msg = [{"role": "user", "content": p}]
        out = client.chat.completions.create(
            model=model, messages=msg, temperature=0, max_tokens=32
        )
        return out.choices[0].message.content

    def constrained(seed: int) -> str:
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Our return policy as JSON."}],
            response_format=JSON_SCHEMA,
            seed=seed,
            temperature=1.0,
            max_tokens=240,
        )
        return out.choices[0].message.content

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(free, PROMPTS))  # the prompts cached, as for every run after
        alone = list(pool.map(free, PROMPTS))
    forced = _stats(server)["jump_forward_tokens"]
    with ThreadPoolExecutor(6) as pool:
        frees = [pool.submit(free, p) for p in PROMPTS]
        cons = [pool.submit(constrained, s) for s in range(3)]
        beside = [f.result() for f in frees]
        for c in cons:
            jsonschema.validate(json.loads(c.result()), SCHEMA)
    # jump-forward ran: at least the constant, for each constrained request
    assert _stats(server)["jump_forward_tokens"] - forced >= 3 * 130
    assert beside == alone
