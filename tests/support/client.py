"""Small clients for the integration tests: one WebSocket request, one SSE stream."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


async def ws_generate(ws_url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Send one request over a fresh WebSocket; collect its deltas and final frame.

    Returns {"text", "token_ids", "deltas", "tool_calls" (the deltas'), "frames" (the
    delta frames), "final", "error"}.
    """
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json({"id": "t", **payload})
        return await ws_collect(ws, "t")


async def ws_collect(ws: aiohttp.ClientWebSocketResponse, rid: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": "",
        "token_ids": [],
        "deltas": [],
        "tool_calls": [],
        "frames": [],
        "final": None,
        "error": None,
    }
    while True:
        frame = await ws.receive_json(timeout=300)
        if frame.get("id") != rid:
            continue
        if frame["type"] == "delta":
            out["frames"].append(frame)
            out["deltas"].append(frame["text"])
            out["text"] += frame["text"]
            out["token_ids"] += frame.get("token_ids", [])
            out["tool_calls"] += frame.get("tool_calls", [])
        elif frame["type"] == "final":
            out["text"] += frame.get("text", "")
            out["final"] = frame
            return out
        elif frame["type"] == "error":
            out["error"] = frame["error"]
            return out


async def sse_stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST with stream=true; return the parsed chunks (raises if [DONE] is missing)."""
    chunks = []
    async with aiohttp.ClientSession() as s, s.post(url, json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        done = False
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    assert done, "stream did not end with data: [DONE]"
    return chunks


async def post_json(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        kwargs = (
            {"data": raw, "headers": {"Content-Type": "application/json"}}
            if raw is not None
            else {"json": body}
        )
        async with s.post(url, **kwargs) as r:
            return r.status, await r.json(content_type=None)


async def get_json(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json(content_type=None)
