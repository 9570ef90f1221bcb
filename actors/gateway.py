"""The gateway actor: the aiohttp server of the HTTP and WebSocket APIs.

It validates requests, assigns request ids, streams deltas back, and aborts a request
whose client went away; the handlers live in ``houchu.dashboard``. The runner's limits
(``max_context``) come from its ``RunnerInfo``, which the engine client receives. It
also serves the dashboard (read from the recorder's database) and ``/metrics``, and
reports each request's arrival to the recorder.
"""

from __future__ import annotations

from pathlib import Path

import zmq.asyncio
from aiohttp import web

from houchu.api.engine_client import EngineClient
from houchu.api.metrics import GatewayMetrics
from houchu.api.observe import RequestObserver
from houchu.dashboard.store import DashboardStore
from houchu.options.serve_config import ServeConfig
from houchu.startup_errors import StartupFailure
from houchu.transport.peers import Peers
from houchu.transport.telemetry import Telemetry


class GatewayActor:
    """Serves ``http://HOST:PORT`` and talks to the tokenizer and scheduler actors."""

    name = "gateway"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        address = config.recorder_address()
        peers = Peers(ctx, config.endpoints)
        self.telemetry = peers.track("recorder", Telemetry(ctx, address, self.name))
        self.metrics = GatewayMetrics()
        gw = config.gateway
        observer = RequestObserver(self.telemetry, self.metrics, gw.api_key is None)
        self.engine = EngineClient(ctx, config.endpoints, gw.request_timeout, observer, peers=peers)
        self.store: DashboardStore | None = None
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        from houchu.actors.placement import check_placement
        from houchu.api.app import make_app
        from houchu.api.limits import GatewayLimits
        from houchu.api.tokenize import GatewayTokenizer

        c = self.config
        gw = c.gateway
        check_placement(c)
        if not Path(c.model).exists():  # it serves the model by that file's name
            raise FileNotFoundError(f"no model at {c.model}")
        name = c.model_name()
        self.engine.start()
        self.telemetry.start()
        self.store = DashboardStore.open(c.telemetry.db_url)
        app = make_app(
            self.engine,
            model_name=name,
            runner=self.engine.runner_limits,  # the runner's RunnerInfo sets them
            store=self.store,
            gateway_metrics=self.metrics,
            limits=GatewayLimits(
                max_in_flight=gw.max_queued_requests,
                max_body_bytes=gw.max_request_bytes,
                stream_buffer_bytes=gw.stream_buffer_bytes,
                api_key=gw.api_key,
            ),
            tool_call_parser=gw.tool_call_parser,
            tokenizer=GatewayTokenizer(c.model, chat_template=c.chat_template),
        )
        # handler_cancellation: a client that goes away while its request is queued or
        # prefilling cancels the handler at once, which aborts the request in the engine.
        self.runner = web.AppRunner(
            app, handle_signals=False, access_log=None, handler_cancellation=True
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, gw.host, gw.port)
        try:
            await site.start()
        except OSError as e:  # the port is taken, or the address is not this host's
            raise StartupFailure(f"cannot listen on {gw.host}:{gw.port}: {e.strerror}") from e
        key = ", API key required" if gw.api_key else ""
        return f"http://{gw.host}:{gw.port} serving {name}{key}"

    async def run(self) -> None:
        await self.engine.stopped.wait()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.telemetry.close()
        await self.engine.close()
        if self.store is not None:
            self.store.close()
