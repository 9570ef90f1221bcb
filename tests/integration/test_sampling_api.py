"""n > 1, logit_bias and the other logits processors, echo with prompt logprobs: through
the official openai client and the WebSocket API against a real server on the default
model (exact path)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from openai import BadRequestError, OpenAI

from tests.support.client import get_json, post_json, ws_generate

pytestmark = pytest.mark.slow

#: 40+ tokens: full pages the choices share.
LONG = "The history of the Roman empire is a long story about roads, law and war. " * 3
COUNT = "1, 2, 3,"


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def _model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def _stats(server) -> dict:
    status, stats = asyncio.run(get_json(f"{server.url}/stats"))
    assert status == 200
    return stats


def _ws(server, **payload) -> dict:
    out = asyncio.run(ws_generate(server.ws_url, payload))
    assert out["error"] is None, out["error"]
    return out


def test_n3_distinct_reproducible_prefilled_once(server, client):
    before = _stats(server)["parallel_sampling_tokens_shared"]
    # a prompt no other test sends: the first request computes its pages, the later ones
    # find them cached, and the choices still compute the same steps (scheduler.groups)
    prompt = LONG + " The roads were built first."
    kw = {"model": _model(client), "prompt": prompt, "max_tokens": 12, "temperature": 1.0}
    out = client.completions.create(**kw, n=3, seed=11)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.text for c in out.choices]
    assert len(set(texts)) == 3, texts
    stats = _stats(server)
    full = (out.usage.prompt_tokens - 1) // stats["page_size"] * stats["page_size"]
    # choices 1 and 2 took the prompt's full pages from choice 0
    assert stats["parallel_sampling_tokens_shared"] - before == 2 * full > 0
    assert out.usage.completion_tokens == 3 * 12
    assert [c.text for c in client.completions.create(**kw, n=3, seed=11).choices] == texts
    # streamed: the same three choices, each chunk with its index; usage counts all
    chunks = client.completions.create(
        **kw, n=3, seed=11, stream=True, stream_options={"include_usage": True}
    )
    got, usage = ["", "", ""], None
    for chunk in chunks:
        for c in chunk.choices:
            got[c.index] += c.text
        usage = chunk.usage or usage
    assert got == texts and usage.completion_tokens == 3 * 12
    # over the WebSocket API too
    ws = asyncio.run(
        ws_generate(server.ws_url, {"prompt": LONG, "max_tokens": 12, "n": 3, "seed": 11})
    )
    assert ws["final"]["usage"]["completion_tokens"] == 36
    assert [c["index"] for c in ws["final"]["choices"]] == [0, 1, 2]


def test_chat_n2_streams_both_choices(client):
    stream = client.chat.completions.create(
        model=_model(client),
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        n=2,
        seed=3,
        stream=True,
    )
    seen: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            seen[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and all(seen.values())


def test_logit_bias_bans_and_forces(server, client):
    plain = _ws(server, prompt=COUNT, max_tokens=4, temperature=0)
    greedy = plain["token_ids"][0]
    banned = _ws(server, prompt=COUNT, max_tokens=4, temperature=0, logit_bias={str(greedy): -100})
    assert banned["token_ids"][0] != greedy
    kw = {"model": _model(client), "prompt": COUNT, "max_tokens": 4, "temperature": 0}
    http = client.completions.create(**kw, logit_bias={str(greedy): -100}).choices[0].text
    assert http != plain["text"] and http == banned["text"]
    rare = plain["token_ids"][1] + 1000
    forced = _ws(server, prompt=COUNT, max_tokens=4, temperature=1.0, logit_bias={str(rare): 100})
    assert forced["token_ids"] == [rare] * 4


def test_allowed_token_ids_bad_words_min_tokens(server, client):
    allowed = _ws(
        server, prompt=COUNT, max_tokens=8, temperature=1.5, seed=2, allowed_token_ids=[33, 34]
    )
    assert set(allowed["token_ids"]) <= {33, 34} and len(allowed["token_ids"]) == 8
    plain = _ws(server, prompt=COUNT, max_tokens=4, temperature=0)
    word = plain["text"].strip().split(",")[0]  # the greedy next number
    kw = {"model": _model(client), "prompt": COUNT, "max_tokens": 4, "temperature": 0}
    text = client.completions.create(**kw, extra_body={"bad_words": [word]}).choices[0].text
    assert word not in text
    # the greedy first token as a stop id ends at once, unless min_tokens holds it off
    stop = [plain["token_ids"][0]]
    quick = client.completions.create(**kw, extra_body={"stop_token_ids": stop})
    assert quick.usage.completion_tokens == 1 and quick.choices[0].finish_reason == "stop"
    held = client.completions.create(**kw, extra_body={"stop_token_ids": stop, "min_tokens": 3})
    assert held.usage.completion_tokens >= 3


def test_stop_reason_is_vllms(server, client):
    """Issue 20: vLLM's ``stop_reason`` beside ``finish_reason``: the stop string or the
    ``stop_token_ids`` id that ended the choice, null for ``length``; in the whole
    answer and in the streamed chunk that ends the choice."""
    plain = _ws(server, prompt=COUNT, max_tokens=4, temperature=0)
    assert "," in plain["text"], plain["text"]  # " 4, 5": the greedy count goes on
    kw = {"model": _model(client), "prompt": COUNT, "max_tokens": 4, "temperature": 0}
    by_string = client.completions.create(**kw, stop=["zz", ","]).choices[0]
    assert (by_string.finish_reason, by_string.model_extra["stop_reason"]) == ("stop", ",")
    assert by_string.text == plain["text"].split(",")[0]
    stop_id = plain["token_ids"][0]
    by_id = client.completions.create(**kw, extra_body={"stop_token_ids": [stop_id]}).choices[0]
    assert (by_id.finish_reason, by_id.model_extra["stop_reason"]) == ("stop", stop_id)
    cut = client.completions.create(**{**kw, "max_tokens": 1}).choices[0]
    assert (cut.finish_reason, cut.model_extra["stop_reason"]) == ("length", None)
    chat = {
        "model": kw["model"],
        "messages": [{"role": "user", "content": "Count: 1, 2, 3,"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    reply = client.chat.completions.create(**chat).choices[0].message.content
    assert len(reply) >= 3, reply
    stop = reply[1:3]  # in the greedy reply: it ends there
    whole = client.chat.completions.create(**chat, stop=[stop]).choices[0]
    assert (whole.finish_reason, whole.model_extra["stop_reason"]) == ("stop", stop)
    chunks = list(client.chat.completions.create(**chat, stop=[stop], stream=True))
    ends = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [(e.finish_reason, e.model_extra["stop_reason"]) for e in ends] == [("stop", stop)]


def test_bad_words_that_ban_every_allowed_token_are_refused(server, client):
    """The tokenizer actor, which encodes ``bad_words``, refuses constraints that leave
    no token (before, the sampler dropped them all and wrote " Paris")."""
    status, tok = asyncio.run(
        post_json(f"{server.url}/tokenize", {"prompt": " Paris", "add_special_tokens": False})
    )
    assert status == 200 and len(tok["tokens"]) == 1
    fields = {"allowed_token_ids": tok["tokens"], "bad_words": ["Paris"]}
    kw = {"model": _model(client), "prompt": "The capital of France is", "max_tokens": 4}
    with pytest.raises(BadRequestError) as err:
        client.completions.create(**kw, temperature=0, extra_body=fields)
    error = err.value.body
    assert error["param"] == "allowed_token_ids" and "'bad_words'" in error["message"]
    ws = asyncio.run(ws_generate(server.ws_url, {"prompt": kw["prompt"], **fields}))
    assert ws["error"]["param"] == "allowed_token_ids" and ws["final"] is None
    # min_tokens beside an allowed set of stop tokens only: a 400 too
    eos = {"allowed_token_ids": [0], "stop_token_ids": [0], "min_tokens": 2}
    with pytest.raises(BadRequestError) as err:
        client.completions.create(**kw, extra_body=eos)
    assert err.value.body["param"] == "min_tokens"
    assert client.completions.create(**kw).choices[0].text  # still serving


@pytest.fixture(scope="module")
def hf_prompt_logprobs(hf_model) -> tuple[list[int], list[float]]:
    """transformers' prompt ids of ``LONG`` and the logprob of each after the first."""
    tok, model = hf_model
    ids = tok(LONG)["input_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()  # [P, V]
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])
    return ids, lp[:, 0].tolist()


def test_echo_prompt_logprobs_match_transformers(server, client, hf_prompt_logprobs):
    ids, want = hf_prompt_logprobs
    kw = {"model": _model(client), "prompt": LONG, "max_tokens": 2, "temperature": 0}
    for _ in range(2):  # the second time, the prompt's pages are cached
        out = client.completions.create(**kw, echo=True, logprobs=2)
        choice = out.choices[0]
        assert choice.text.startswith(LONG)
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) + 2 and lp.token_logprobs[0] is None
        assert lp.top_logprobs[0] is None and all(len(t) >= 2 for t in lp.top_logprobs[1:])
        got = lp.token_logprobs[1 : len(ids)]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=2e-3)
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert "".join(lp.tokens) == choice.text
    # vLLM's field, on chat and over the WebSocket API
    vllm = client.completions.create(**kw, extra_body={"prompt_logprobs": 0})
    plps = vllm.choices[0].model_extra["prompt_logprobs"]
    assert plps[0] is None and len(plps) == len(ids)
    again = [plps[i + 1][str(t)]["logprob"] for i, t in enumerate(ids[1:])]
    torch.testing.assert_close(torch.tensor(again), torch.tensor(got), rtol=0, atol=1e-5)
    ws = _ws(server, prompt=LONG, max_tokens=1, prompt_logprobs=0)
    assert ws["final"]["usage"]["prompt_tokens"] == len(ids)


def test_echo_prompt_logprobs_have_the_alternatives_asked_for(server, client):
    """``echo`` + ``logprobs: 3`` computes the prompt's logprobs with 3 alternatives
    (each prompt token's ``top_logprobs``: up to 3 and the token itself, no
    ``prompt_logprobs`` field); with vLLM's ``prompt_logprobs: 0`` beside them, as vLLM
    does, with none: the prompt's ``top_logprobs`` and ``prompt_logprobs`` entries hold
    the token alone, while the completion's tokens keep their 3; over the WebSocket
    API alike."""
    kw = {"model": _model(client), "prompt": COUNT, "max_tokens": 2, "temperature": 0}
    plain = client.completions.create(**kw, echo=True, logprobs=3).choices[0]
    assert "prompt_logprobs" not in (plain.model_extra or {})
    prompt_len = len(plain.logprobs.tokens) - 2
    tops = plain.logprobs.top_logprobs
    assert tops[0] is None and all(3 <= len(t) <= 4 for t in tops[1:])
    zero = client.completions.create(
        **kw, echo=True, logprobs=3, extra_body={"prompt_logprobs": 0}
    ).choices[0]
    lp = zero.logprobs
    assert lp.top_logprobs[0] is None
    for tok, top in zip(lp.tokens[1:prompt_len], lp.top_logprobs[1:prompt_len], strict=True):
        assert list(top) == [tok]
    assert all(3 <= len(t) <= 4 for t in lp.top_logprobs[prompt_len:])
    plps = zero.model_extra["prompt_logprobs"]
    assert plps[0] is None and all(len(e) == 1 for e in plps[1:]) and len(plps) == prompt_len
    assert lp.token_logprobs[1:prompt_len] == [next(iter(e.values()))["logprob"] for e in plps[1:]]
    ws = _ws(server, prompt=COUNT, max_tokens=2, echo=True, logprobs=3, prompt_logprobs=0)
    echo = ws["frames"][0]
    assert [e["top_logprobs"] for e in echo["logprobs"]] == [None] + [[]] * (prompt_len - 1)
    assert all(len(e) == 1 for e in echo["prompt_logprobs"][1:])


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client, hf_prompt_logprobs):
    """Evaluation harnesses score a text with ``echo``, ``logprobs`` and ``max_tokens`` 0:
    the prompt comes back with its logprobs and nothing is generated, whole or streamed."""
    ids, want = hf_prompt_logprobs
    kw = {"model": _model(client), "prompt": LONG, "max_tokens": 0, "echo": True, "logprobs": 1}
    out = client.completions.create(**kw)
    choice = out.choices[0]
    assert choice.text == LONG and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    got = torch.tensor(lp.token_logprobs[1:])
    torch.testing.assert_close(got, torch.tensor(want), rtol=0, atol=2e-3)
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == LONG
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    with pytest.raises(BadRequestError) as e:  # without echo there would be nothing to return
        client.completions.create(**{**kw, "echo": False})
    assert e.value.body["param"] == "max_tokens"


def test_websocket_echo_means_what_completions_echo_means(server, client):
    """``echo`` + ``logprobs`` on a WebSocket prompt frame: the prompt's text, then its
    tokens' logprobs (the first null), alternatives and text offsets, as
    ``POST /v1/completions`` returns them for the same request."""
    kw = {"prompt": "The cat sat", "max_tokens": 2, "temperature": 0}
    http = client.completions.create(model=_model(client), **kw, echo=True, logprobs=1)
    ws = _ws(server, **kw, echo=True, logprobs=1)
    echo = ws["frames"][0]
    assert echo["echo"] and echo["text"] == kw["prompt"] and echo["token_ids"] == []
    assert ws["text"] == http.choices[0].text
    entries = [e for f in ws["frames"] for e in f.get("logprobs", [])]
    lp = http.choices[0].logprobs
    assert len(entries) == len(echo["logprobs"]) + 2
    assert [e["token"] for e in entries] == lp.tokens
    assert [e["text_offset"] for e in entries] == lp.text_offset
    assert entries[0]["logprob"] is None and entries[0]["top_logprobs"] is None
    got = torch.tensor([e["logprob"] for e in entries[1:]])
    torch.testing.assert_close(got, torch.tensor(lp.token_logprobs[1:]), rtol=0, atol=1e-4)
    for e, top in zip(entries[1:], lp.top_logprobs[1:], strict=True):
        assert {t["token"]: t["logprob"] for t in e["top_logprobs"]}.keys() <= top.keys()


def test_continue_final_message_reaches_the_engines_template(server, client):
    """vLLM's ``continue_final_message``: the engine renders the open final message (the
    prompt's tokens are ``/tokenize``'s for the same fields, fewer than with a new
    assistant turn), over HTTP chat and a WebSocket chat frame alike."""
    msgs = [
        {"role": "user", "content": "Count to five."},
        {"role": "assistant", "content": "1, 2, 3,"},
    ]
    opts = {"continue_final_message": True, "add_generation_prompt": False}
    status, ids = asyncio.run(post_json(f"{server.url}/tokenize", {"messages": msgs, **opts}))
    assert status == 200, ids
    kw = {"model": _model(client), "messages": msgs, "max_tokens": 3, "temperature": 0}
    out = client.chat.completions.create(**kw, extra_body=opts)
    assert out.usage.prompt_tokens == ids["count"]
    new_turn = client.chat.completions.create(**kw)
    assert new_turn.usage.prompt_tokens > ids["count"]
    ws = _ws(server, messages=msgs, max_tokens=3, temperature=0, **opts)
    assert ws["final"]["usage"]["prompt_tokens"] == ids["count"]
    assert ws["text"] == out.choices[0].message.content


def test_bad_input_is_a_400_and_the_server_keeps_serving(client):
    kw = {"model": _model(client), "prompt": COUNT, "max_tokens": 2}
    for extra, param in [
        ({"logit_bias": {"10000000": 5}}, "logit_bias"),
        ({"logit_bias": {"5": 150}}, "logit_bias"),
        ({"extra_body": {"allowed_token_ids": [10**7]}}, "allowed_token_ids"),
        ({"extra_body": {"stop_token_ids": [10**9]}}, "stop_token_ids"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"extra_body": {"min_tokens": 5}}, "min_tokens"),
    ]:
        with pytest.raises(BadRequestError) as e:
            client.completions.create(**kw, **extra)
        assert e.value.body["param"] == param, e.value.body
    assert client.completions.create(**kw).choices[0].text
