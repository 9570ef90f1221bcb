"""Message round trips through the codec and through real ZeroMQ sockets."""

from __future__ import annotations

import msgspec
import pytest
import zmq.asyncio

from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import (
    AbortRequest,
    ChatMessage,
    FinishRequest,
    GenerateRequest,
    RunnerInbox,
    SamplingParams,
    SchedulerInbox,
    SeqInit,
    SeqOutput,
    SeqWork,
    StepPlan,
    StepResult,
    TextDelta,
    TokenBatch,
    TokenEvent,
    TokenizerInbox,
    TokenLogprob,
)

SAMPLES = [
    (
        TokenizerInbox,
        GenerateRequest(rid="r1", prompt="hi 你好 🎉", sampling=SamplingParams(seed=3)),
    ),
    (
        TokenizerInbox,
        GenerateRequest(rid="r2", messages=[ChatMessage("user", "hello")], arrival_time=1.5),
    ),
    (TokenizerInbox, AbortRequest("r1")),
    (SchedulerInbox, FinishRequest("r1")),
    (
        TokenizerInbox,
        TokenBatch(
            [
                TokenEvent(
                    rid="r", token_ids=[1, 2], logprobs=[-0.1, -2.0], top_logprobs=[[(1, -0.1)], []]
                )
            ]
        ),
    ),
    (
        RunnerInbox,
        StepPlan(
            step_id=4,
            work=[SeqWork(rid="a", token_ids=[5, 6], start_pos=3, page_table=[9, 1], sample=True)],
            init=[SeqInit(rid="a", sampling=SamplingParams(stop=["x"]), prompt_ids=[1, 2, 3])],
            release=["b"],
        ),
    ),
    (
        SchedulerInbox,
        StepResult(
            step_id=4,
            outputs=[SeqOutput(rid="a", token_id=7, logprob=-0.5, top_logprobs=[(7, -0.5)])],
            duration_s=0.01,
            num_tokens=2,
        ),
    ),
]


@pytest.mark.parametrize("accepts,msg", SAMPLES)
def test_codec_round_trip(accepts, msg):
    data = msgspec.msgpack.encode(msg)
    assert msgspec.msgpack.Decoder(accepts).decode(data) == msg


def test_unexpected_message_type_is_rejected():
    data = msgspec.msgpack.encode(TextDelta(rid="x", text="y"))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(SchedulerInbox).decode(data)


def test_text_delta_with_logprobs_round_trip():
    lp = TokenLogprob(token="é", token_id=5, logprob=-1.0, bytes_=[195, 169], top=[("é", 5, -1.0)])
    msg = TextDelta(rid="r", text="é", logprobs=[lp], finish_reason="stop", completion_tokens=1)
    assert msgspec.msgpack.Decoder(TextDelta).decode(msgspec.msgpack.encode(msg)) == msg


async def test_channel_over_ipc(tmp_path):
    ctx = zmq.asyncio.Context()
    ep = Endpoints.ipc(tmp_path)
    inbox: Inbox = Inbox(ctx, ep["scheduler"], SchedulerInbox)
    out = Outbox(ctx, ep["scheduler"])
    try:
        sent = SAMPLES[-1][1]
        await out.send(sent)
        assert await inbox.recv() == sent
        # a message of a type this inbox does not accept is a BadMessage, and the inbox
        # keeps working afterwards
        await out.send(TextDelta(rid="x", text="y"))
        with pytest.raises(BadMessage):
            await inbox.recv()
        await out.send(AbortRequest("z"))
        assert await inbox.recv() == AbortRequest("z")
        assert inbox.recv_nowait() is None
    finally:
        out.close()
        inbox.close()
        ctx.destroy(linger=0)
