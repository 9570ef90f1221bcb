"""The tokenizer actor: chat template and encoding on the way in; incremental
detokenization and stop strings on the way out.

Inbox: ``GenerateRequest`` / ``AbortRequest`` from the gateway, ``TokenBatch`` from the
scheduler. A stop string needs text, so it is matched here; the scheduler is then told to
finish the request (``AbortRequest(reason="stop")``).

Telemetry: "tokenized" (prompt_tokens), and the end of each request as the client sees
it: "finished" (finish_reason, prompt/completion/cached tokens, ``first_token_t``: when
its first token reached this actor), "aborted" or "failed" (error).

Restarts (``ActorDown``): when the gateway is replaced, every request is aborted (its
client is gone; the scheduler frees its pages); when the scheduler is replaced, every
request it held fails with HTTP 503 (prompts still being encoded go to the new one).
"""

from __future__ import annotations

import asyncio
import time

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.text.request_text import RequestText
from houchu.transport.channel import BadMessage, Inbox
from houchu.transport.messages import (
    AbortRequest,
    ActorDown,
    ActorUp,
    GenerateRequest,
    RequestFailed,
    Shutdown,
    TextDelta,
    TokenBatch,
    TokenEvent,
    TokenizedRequest,
    TokenizerInbox,
)
from houchu.transport.peers import Peers, drain
from houchu.transport.telemetry import Telemetry

#: The error ``code`` a client sees, by HTTP status.
_ERROR_CODES = {400: "invalid_request_error", 429: "server_overloaded", 503: "unavailable"}


class TokenizerActor:
    """Text <-> tokens for every request."""

    name = "tokenizer"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        ep = config.endpoints
        self.inbox: Inbox[TokenizerInbox] = Inbox(ctx, ep["tokenizer"], TokenizerInbox)
        self.peers = Peers(ctx, ep)
        self.to_scheduler = self.peers.outbox("scheduler")
        self.to_gateway = self.peers.outbox("gateway")
        self.requests: dict[str, RequestText] = {}
        self.encoding: dict[str, bool] = {}  # rid -> aborted, while its prompt is encoded
        self.tasks: set[asyncio.Task[None]] = set()
        self.tokenizer = None
        self.max_context = 0
        address = config.recorder_address()
        self.telemetry = self.peers.track("recorder", Telemetry(ctx, address, self.name))
        self.first_token_t: dict[str, float] = {}  # rid -> wall-clock s of its first token

    async def start(self) -> str:
        from houchu.gpu.config import load_model_config
        from houchu.text.tokenizer import load_tokenizer

        loop = asyncio.get_running_loop()
        self.tokenizer = await loop.run_in_executor(None, load_tokenizer, self.config.model)
        model = load_model_config(self.config.model)
        cap = self.config.runner.max_context
        self.max_context = min(model.max_position, cap or model.max_position)
        # No token is longer than this many characters, so a prompt with more characters
        # than max_context * longest cannot fit: reject it without tokenizing it.
        tok = self.tokenizer
        self.max_token_chars = max(len(tok.token_bytes(i)) for i in range(tok.vocab_size)) or 1
        self.telemetry.start()
        return f"vocabulary {self.tokenizer.vocab_size}, context {self.max_context}"

    async def run(self) -> None:
        while True:
            try:
                msg = await self.inbox.recv()
            except BadMessage as e:
                print(f"houchu tokenizer: dropped a bad message: {e}", flush=True)
                continue
            if not await self._handle(msg):
                return

    async def _handle(self, msg: TokenizerInbox) -> bool:
        """Act on one message; False on ``Shutdown``."""
        match msg:
            case GenerateRequest():
                # a task: other requests' tokens keep flowing while a prompt encodes
                self.encoding[msg.rid] = False
                task = asyncio.create_task(self._on_request(msg))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            case TokenBatch(events=events):
                await self._on_tokens(events)
            case AbortRequest(rid=rid):
                self._forget(rid)
                await self.to_scheduler.send(msg)
            case ActorDown(name=name):
                if not await drain(self.inbox, self._handle, self.name):
                    return False
                self.peers.reconnect(name)
                if name == "gateway":  # its clients are gone: abort everything
                    for rid in [*self.requests, *self.encoding]:
                        self._forget(rid)
                        await self.to_scheduler.send(AbortRequest(rid, "abort"))
                elif name == "scheduler":  # what it held is lost: fail those requests
                    for rid in list(self.requests):
                        del self.requests[rid]
                        await self._fail(rid, "the scheduler stopped and is restarting; retry", 503)
            case ActorUp():
                pass
            case Shutdown():
                return False
        return True

    def _forget(self, rid: str) -> None:
        """Drop ``rid`` (aborted): no more text for it, its encoding is not forwarded."""
        if rid in self.encoding:
            self.encoding[rid] = True
        state = self.requests.pop(rid, None)
        self.first_token_t.pop(rid, None)
        if state is not None:
            self.telemetry.event(rid, "aborted", completion_tokens=state.completion_tokens)

    async def _on_request(self, req: GenerateRequest) -> None:
        chars = len(req.prompt or "") + sum(len(m.content) for m in req.messages or [])
        if chars > self.max_context * self.max_token_chars:
            self.encoding.pop(req.rid, None)
            await self._fail(
                req.rid,
                f"the prompt has {chars} characters, more than a "
                f"{self.max_context}-token context window can hold",
            )
            return
        try:
            # in a worker thread: a long prompt does not hold up other requests' text
            ids = await asyncio.to_thread(self._encode, req)
            if self.encoding.pop(req.rid, True):
                return  # aborted while it was being encoded
        except Exception as e:  # the template or encoder refused this input
            self.encoding.pop(req.rid, None)
            await self._fail(req.rid, f"could not tokenize the request: {e}")
            return
        s = req.sampling
        if not ids:
            await self._fail(req.rid, "the prompt is empty (0 tokens)")
            return
        if len(ids) + s.max_tokens > self.max_context:
            await self._fail(
                req.rid,
                f"this model's maximum context length is {self.max_context} tokens; the "
                f"request has {len(ids)} prompt tokens and asks for {s.max_tokens} more",
            )
            return
        if any(t < 0 or t >= self.tokenizer.vocab_size for t in ids):
            await self._fail(
                req.rid, f"prompt token ids must be in [0, {self.tokenizer.vocab_size})"
            )
            return
        eos = self.tokenizer.eos_token_ids
        self.telemetry.event(req.rid, "tokenized", prompt_tokens=len(ids))
        self.requests[req.rid] = RequestText(req.rid, self.tokenizer, ids, s, eos)
        await self.to_scheduler.send(
            TokenizedRequest(
                rid=req.rid,
                prompt_ids=ids,
                sampling=s,
                eos_token_ids=eos,
                arrival_time=req.arrival_time or time.time(),
            )
        )

    def _encode(self, req: GenerateRequest) -> list[int]:
        """Prompt token ids. Raises TokenizerError (or the library's error) on bad input."""
        if req.messages is not None:
            return self.tokenizer.apply_chat_template(req.messages)
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        return self.tokenizer.encode(req.prompt or "")

    async def _fail(self, rid: str, message: str, status: int = 400) -> None:
        self.first_token_t.pop(rid, None)
        self.telemetry.event(rid, "failed", error=message[:500], status=status)
        code = _ERROR_CODES.get(status, "internal_error")
        await self.to_gateway.send(
            RequestFailed(rid=rid, message=message, status=status, code=code)
        )

    async def _on_tokens(self, events: list[TokenEvent]) -> None:
        for ev in events:
            state = self.requests.get(ev.rid)
            if state is None:
                continue  # finished by a stop string or aborted: late tokens are dropped
            if ev.finish_reason == "error":
                del self.requests[ev.rid]
                await self._fail(ev.rid, ev.error or "request failed", ev.error_status)
                continue
            if ev.token_ids and ev.rid not in self.first_token_t:
                self.first_token_t[ev.rid] = time.time()
            delta = state.on_event(ev)
            if delta is None:
                continue
            if state.finished:
                del self.requests[ev.rid]
                self._finished(delta)
                if ev.finish_reason is None:  # a stop string finished it, not the scheduler
                    await self.to_scheduler.send(AbortRequest(ev.rid, "stop"))
            await self.to_gateway.send(delta)

    def _finished(self, delta: TextDelta) -> None:
        self.telemetry.event(
            delta.rid,
            "finished",
            finish_reason=delta.finish_reason or "stop",
            prompt_tokens=delta.prompt_tokens,
            completion_tokens=delta.completion_tokens,
            cached_tokens=delta.cached_tokens,
            first_token_t=self.first_token_t.pop(delta.rid, 0.0),
        )

    async def close(self) -> None:
        await self.telemetry.close()
        self.inbox.close()
        self.peers.close()
