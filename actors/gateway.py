"""The gateway actor: the aiohttp server of the HTTP and WebSocket APIs.

It validates requests, assigns request ids, streams deltas back, and aborts a request
whose client went away; the handlers live in ``houchu.dashboard``.
"""

from __future__ import annotations

import zmq.asyncio
from aiohttp import web

from houchu.actors.config import ServeConfig
from houchu.dashboard.engine_client import EngineClient


class GatewayActor:
    """Serves ``http://HOST:PORT`` and talks to the tokenizer and scheduler actors."""

    name = "gateway"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        self.engine = EngineClient(ctx, config.endpoints, config.request_timeout_s)
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        from houchu.dashboard.app import make_app
        from houchu.gpu.config import load_model_config

        c = self.config
        model = load_model_config(c.model_path)
        max_context = min(model.max_position, c.max_context or model.max_position)
        name = c.model_name()
        self.engine.start()
        app = make_app(self.engine, model_name=name, max_context=max_context)
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, c.host, c.port)
        await site.start()
        return f"http://{c.host}:{c.port} serving {name}"

    async def run(self) -> None:
        await self.engine.stopped.wait()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.engine.close()
