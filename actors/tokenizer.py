"""The tokenizer actor: chat template and encoding on the way in; incremental
detokenization and stop strings on the way out.

Inbox: ``GenerateRequest`` / ``AbortRequest`` from the gateway, ``TokenBatch`` from the
scheduler, ``RunnerInfo`` from the runner (its limits: prompts wait for the first one).
A stop string needs text, so it is matched here; the scheduler is then told that the
request is finished (``FinishRequest``).

Failures: a request this actor refuses, or one the scheduler failed (a
``TokenEvent.failure``), goes back to the gateway as a ``RequestFailed`` with its
``Failure`` unchanged.

Telemetry: "tokenized" (prompt_tokens), and the end of each request as the client sees
it: "finished" (finish_reason, prompt/completion/cached tokens, ``first_token_t``: when
its first token reached this actor), "aborted" or "failed" (error).

Restarts (``ActorDown``): when the gateway is replaced, every request is aborted (its
client is gone; the scheduler frees its pages); when the scheduler is replaced, every
request it held fails with HTTP 503 (prompts still being encoded go to the new one).
"""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec
import zmq.asyncio

from houchu.options.serve_config import ServeConfig
from houchu.text.bad_words import bad_words_ids
from houchu.text.request_text import RequestText
from houchu.text.stop import stop_ids
from houchu.text.token_conflicts import no_token_left
from houchu.transport.actor_base import ActorBase
from houchu.transport.failures import bad_request, internal, unavailable
from houchu.transport.limits import LimitsWatch, tokens_left
from houchu.transport.messages import (
    AbortRequest,
    Failure,
    FinishRequest,
    GenerateRequest,
    RequestFailed,
    RunnerInfo,
    StepStamps,
    TextDelta,
    TokenBatch,
    TokenEvent,
    TokenizedRequest,
    TokenizerInbox,
)

#: Printed at start-up for a chat template that never shows the model the tools.
NO_TOOLS_NOTE = (
    "houchu: note: this model's chat template ignores 'tools': tool_choice 'auto' will "
    "not call tools; 'required' or a named function still do (structured output)"
)


class TokenizerActor(ActorBase[TokenizerInbox]):
    """Text <-> tokens for every request."""

    name = "tokenizer"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        super().__init__(ctx, config.endpoints, TokenizerInbox)
        self.config = config
        self.to_scheduler = self.peers.outbox("scheduler")
        self.to_gateway = self.peers.outbox("gateway")
        self.requests: dict[str, RequestText] = {}
        self.encoding: dict[str, bool] = {}  # rid -> aborted, while its prompt is encoded
        self.tasks: set[asyncio.Task[None]] = set()
        self.tokenizer = None
        self.limits = LimitsWatch()  # the runner's, from its RunnerInfo
        self.max_token_chars = 1  # characters of the longest token
        self.telemetry = self.telemetry_to(config.recorder_address())
        self.first_token_t: dict[str, float] = {}  # rid -> wall-clock s of its first token

    async def start(self) -> str:
        from houchu.text.tokenizer.core import load_tokenizer

        loop = asyncio.get_running_loop()
        c = self.config
        self.tokenizer = await loop.run_in_executor(None, load_tokenizer, c.model, c.chat_template)
        # No token is longer than this many characters, so a prompt of C characters has
        # at least C / longest tokens: one that cannot fit is refused before encoding.
        tok = self.tokenizer
        self.max_token_chars = max(len(tok.token_bytes(i)) for i in range(tok.vocab_size)) or 1
        self.telemetry.start()
        if tok.chat_template is not None and not tok.template_reads_tools:
            print(NO_TOOLS_NOTE, file=sys.stderr, flush=True)
        return f"vocabulary {tok.vocab_size}; chat template: {tok.chat_template_source}"

    async def handle(self, msg: TokenizerInbox) -> None:
        match msg:
            case GenerateRequest():
                # a task: other requests' tokens keep flowing while a prompt encodes
                self.encoding[msg.rid] = False
                task = asyncio.create_task(self._on_request(msg))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            case TokenBatch(events=events, stamps=stamps):
                if stamps is not None:  # the token path's stamp (StepStamps)
                    stamps.tokenizer_received = time.time()
                await self._on_tokens(events, stamps)
            case AbortRequest(rid=rid):
                self._forget(rid)
                await self.to_scheduler.send(msg)
            case RunnerInfo():
                self.limits.update(msg)

    async def on_peer_down(self, name: str) -> None:
        if name == "gateway":  # its clients are gone: abort everything
            for rid in [*self.requests, *self.encoding]:
                self._forget(rid)
                await self.to_scheduler.send(AbortRequest(rid))
        elif name == "scheduler":  # what it held is lost: fail those requests
            lost = unavailable("the scheduler stopped and is restarting; retry")
            for rid in list(self.requests):
                del self.requests[rid]
                await self._fail(rid, lost)

    def _forget(self, rid: str) -> None:
        """Drop ``rid`` (aborted): no more text for it, its encoding is not forwarded."""
        if rid in self.encoding:
            self.encoding[rid] = True
        state = self.requests.pop(rid, None)
        self.first_token_t.pop(rid, None)
        if state is not None:
            self.telemetry.event(rid, "aborted", completion_tokens=state.completion_tokens)

    async def _on_request(self, req: GenerateRequest) -> None:
        """Encode the prompt and send it to the scheduler, or fail the request (a text
        that cannot fit the context window is refused before it is encoded)."""
        limits = await self.limits.wait()  # the runner's, once it has loaded its model
        s = req.sampling
        chars = len(req.prompt or "") + sum(len(m.content) for m in req.messages or [])
        fewest = -(-chars // self.max_token_chars)  # tokens the text needs at least
        asked = 1 if s.max_tokens_is_default else s.max_tokens  # a default adapts below
        too_long = limits.context_failure(asked, fewest, at_least=True)
        if too_long is not None:
            self.encoding.pop(req.rid, None)
            await self._fail(req.rid, too_long)
            return
        try:
            # in a worker thread: a long prompt does not hold up other requests' text
            ids = await asyncio.to_thread(self._encode, req)
            if self.encoding.pop(req.rid, True):
                return  # aborted while it was being encoded
        except Exception as e:  # the template or encoder refused this input
            self.encoding.pop(req.rid, None)
            await self._fail(req.rid, bad_request(f"could not tokenize the request: {e}"))
            return
        failure = limits.token_id_failure(ids)
        if not ids:
            failure = bad_request("the prompt is empty (0 tokens)")
        if failure is not None:
            await self._fail(req.rid, failure)
            return
        room = tokens_left(limits.max_context, len(ids))  # < 1: the scheduler's check refuses it
        if s.max_tokens_is_default and 1 <= room < s.max_tokens:
            s = msgspec.structs.replace(s, max_tokens=room)
        if s.bad_words:
            s = msgspec.structs.replace(s, bad_words_ids=bad_words_ids(self.tokenizer, s.bad_words))
        stops = stop_ids(s, self.tokenizer.eos_token_ids)
        failure = no_token_left(
            limits.vocab_size or self.tokenizer.vocab_size,
            allowed=s.allowed_token_ids,
            logit_bias=s.logit_bias,
            bad_words_ids=s.bad_words_ids,
            min_tokens=s.min_tokens,
            stop_ids=stops,
        )
        if failure is not None:  # the constraints leave nothing to sample: a 400
            await self._fail(req.rid, failure)
            return
        self.telemetry.event(req.rid, "tokenized", prompt_tokens=len(ids))
        self.requests[req.rid] = RequestText(
            req.rid, self.tokenizer, ids, s, stops, prompt_text=req.prompt
        )
        await self.to_scheduler.send(
            TokenizedRequest(
                rid=req.rid,
                prompt_ids=ids,
                sampling=s,
                stop_ids=stops,
                arrival_time=req.arrival_time or time.time(),
                prefill_group=req.prefill_group,
                prefill_group_size=req.prefill_group_size,
            )
        )

    def _encode(self, req: GenerateRequest) -> list[int]:
        """Prompt token ids. Raises TokenizerError (or the library's error) on bad input."""
        if req.messages is not None:
            return self.tokenizer.apply_chat_template(
                req.messages,
                req.tools,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        return self.tokenizer.encode(req.prompt or "")

    async def _fail(self, rid: str, failure: Failure) -> None:
        """Tell the gateway that ``rid`` failed, and why."""
        self.first_token_t.pop(rid, None)
        self.telemetry.event(rid, "failed", error=failure.message[:500], status=failure.status)
        await self.to_gateway.send(RequestFailed(rid=rid, failure=failure))

    async def _on_tokens(self, events: list[TokenEvent], stamps: StepStamps | None = None) -> None:
        """Detokenize one step's events and send the text they release; each delta
        carries the step's ``stamps`` with this actor's ``tokenizer_sent``."""
        for ev in events:
            state = self.requests.get(ev.rid)
            if state is None:
                continue  # finished by a stop string or aborted: late tokens are dropped
            if ev.finish_reason == "error":
                del self.requests[ev.rid]
                await self._fail(ev.rid, ev.failure or internal("request failed"))
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
                    await self.to_scheduler.send(FinishRequest(ev.rid))
            if stamps is not None:
                delta.stamps = msgspec.structs.replace(stamps, tokenizer_sent=time.time())
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
