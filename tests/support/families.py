"""Scaffolding shared by the model-family tests (Llama, Qwen, Mistral / Gemma, DeepSeek).

Each family test builds a tiny random model with transformers (``from_config``), loads it
with houchu and compares logits or greedy tokens with transformers' own classes. This
module holds what they all use: prompts, transformers' logits and greedy tokens, a driver
of a loaded model over one paged KV pool (:class:`Runner`), greedy decoding through
``ModelRunner`` and serving through the scheduler with draft proposals.
"""

from __future__ import annotations

import random

import torch

from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.batch import build_batch
from houchu.model.kv.pool import KVPool
from houchu.model.llama import LlamaModel
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.speculative.proposers import Proposer
from houchu.text.stop import stop_ids
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan, TokenizedRequest
from houchu.transport.spec_messages import DraftProposal, DraftReply

ATOL = 1e-4  # fp32 logits against transformers'
PAGE = 4  # tokens per KV page of the Runner's pool
NUM_PAGES = 64


def prompt(seed: int, n: int) -> list[int]:
    """``n`` random token ids in [3, 128) (within the tiny models' vocabulary)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 128) for _ in range(n)]


def tiny_family(tmp_path_factory, name: str, *, seed: int, gguf: bool, **config):
    """(family, HF dir, GGUF path or None, transformers model) of a tiny random model.

    ``name``: the family (``make_tiny_model``'s kind), optionally ``-variant``;
    ``config``: overrides of the tiny config; ``gguf``: also write the GGUF llama.cpp's
    converter would write.
    """
    from transformers import AutoModelForCausalLM

    kind = name.split("-")[0]
    base = tmp_path_factory.mktemp(name)
    path = make_tiny_model(base / "hf", kind, seed=seed, **config)
    gguf_path = write_llama_gguf(path, base / "model.gguf") if gguf else None
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return kind, path, gguf_path, hf


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """[n, V] fp32 logits of every position of ``ids``."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' ``n`` greedy tokens after ``ids`` (no EOS stop)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(ids) :].tolist()


class Runner:
    """Drives a loaded model directly: one pool, scattered page tables per sequence."""

    def __init__(self, model: LlamaModel, seed: int = 0) -> None:
        self.model = model
        self.pool = KVPool.for_model(
            model.cfg, page_size=PAGE, dtype=model.dtype, num_pages=NUM_PAGES
        )
        self.backend = TorchSDPABackend()
        self.free = list(range(NUM_PAGES))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}

    def pages(self, rid: str, n_tokens: int) -> list[int]:
        table = self.tables.setdefault(rid, [])
        while len(table) * PAGE < n_tokens:
            table.append(self.free.pop())
        return list(table)

    def step(self, items: list[tuple[str, list[int], int]]) -> torch.Tensor:
        """items: (rid, token_ids, start_pos), all sampled. Returns [S, V] logits."""
        work = [
            SeqWork(
                rid=r, token_ids=t, start_pos=s, page_table=self.pages(r, s + len(t)), sample=True
            )
            for r, t, s in items
        ]
        batch = build_batch(
            work, page_size=PAGE, num_pages=NUM_PAGES, max_context=512, vocab_size=128
        )
        with torch.inference_mode():
            return self.model(batch, self.pool, self.backend)


def assert_chunked_logits_match(r: Runner, hf) -> None:
    """29 tokens through ``r`` as prefill chunks of 17 and 5, then decode steps and a
    chunk of 4 over the cached KV: each step's last logits equal transformers'."""
    ids = prompt(3, 29)
    want = hf_logits(hf, ids)  # [29, V]
    pos = 0
    for n in [17, 5, 1, 1, 4, 1]:
        got = r.step([("a", ids[pos : pos + n], pos)])[0]
        pos += n
        torch.testing.assert_close(got, want[pos - 1], atol=ATOL, rtol=0)


def runner_greedy_tokens(
    runner: ModelRunner, ids: list[int], n: int, *, rid: str = "a", first_page: int = 0
) -> list[int]:
    """``n`` greedy tokens after ``ids`` through ``runner.execute`` (one sequence ``rid``,
    pages ``first_page`` .. ``first_page + 7``: a prefill step, then decode steps). A
    runner keeps each rid registered: call it again on the same runner with another
    ``rid`` (and other pages)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    init = [SeqInit(rid=rid, sampling=greedy, prompt_ids=ids)]
    table = list(range(first_page, first_page + 8))
    got: list[int] = []
    work = SeqWork(rid=rid, token_ids=ids, start_pos=0, page_table=table, sample=True)
    for step in range(n):
        res = runner.execute(StepPlan(step_id=step, work=[work], init=init if step == 0 else []))
        assert res.error is None, res.error
        got.append(res.outputs[0].token_id)
        pos = len(ids) + step
        work = SeqWork(rid=rid, token_ids=[got[-1]], start_pos=pos, page_table=table, sample=True)
    return got


def serve_with_drafts(
    core: SchedulerCore,
    runner: ModelRunner,
    proposer: Proposer | None,
    prompts: dict[str, list[int]],
    sampling: SamplingParams,
) -> dict[str, list[int]]:
    """Queue ``prompts`` and serve them to the end through ``core`` and ``runner``, asking
    ``proposer`` (``NgramProposer``; None: the runner proposes, ``houchu.speculative.mtp``) for
    the drafts the scheduler wants before each plan; returns each request's tokens.
    Fails if work is left after 200 rounds."""
    for rid, p in prompts.items():
        core.add(
            TokenizedRequest(
                rid=rid, prompt_ids=p, sampling=sampling, stop_ids=stop_ids(sampling, [])
            )
        )
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    for _ in range(200):
        if not core.has_work:
            break
        if proposer is not None and (dr := core.draft_request()) is not None:
            proposer.release(dr.release)
            props = [DraftProposal(r, ids) for r, ids in proposer.propose(dr.seqs).items()]
            core.attach_drafts(DraftReply(query_id=dr.query_id, proposals=props), 0.0)
        plan = core.next_plan()
        if plan is not None:
            for ev in core.apply(runner.execute(plan)):
                out[ev.rid] += ev.token_ids
        if proposer is not None and (rel := core.spec.release_request()) is not None:
            proposer.release(rel.release)
    assert not core.has_work
    return out


def serve_waves(
    runner: ModelRunner,
    waves: list[dict[str, list[int]]],
    n: int,
    *,
    max_batch_tokens: int = 24,
    chunked_prefill_size: int = 8,
) -> tuple[dict[str, list[int]], dict[str, int], SchedulerCore]:
    """Serve ``waves`` of greedy requests (rid -> prompt ids) one wave after the other
    through one ``SchedulerCore`` and ``runner``, batched and with chunked prefill, ``n``
    tokens each (no EOS stop). Returns each request's tokens, its cached prompt tokens
    (radix-cache hits) and the core. Fails if work is left after 200 rounds a wave."""
    from houchu.options.batching_options import BatchingOptions

    batching = BatchingOptions(
        max_batch_tokens=max_batch_tokens, chunked_prefill_size=chunked_prefill_size
    )
    core = SchedulerCore(runner.info(), batching)
    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    out: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    for wave in waves:
        for rid, p in wave.items():
            out[rid] = []
            core.add(
                TokenizedRequest(
                    rid=rid, prompt_ids=p, sampling=greedy, stop_ids=stop_ids(greedy, [])
                )
            )
        for _ in range(200):
            if not core.has_work:
                break
            plan = core.next_plan()
            if plan is not None:
                for ev in core.apply(runner.execute(plan)):
                    out[ev.rid] += ev.token_ids
                    cached[ev.rid] = max(cached.get(ev.rid, 0), ev.cached_tokens)
        assert not core.has_work
    return out, cached, core


def assert_scheduled_waves_equal_hf(runner: ModelRunner, hf) -> None:
    """Through the scheduler, two waves: a batch of three prompts of different lengths
    (chunked prefill where the runner's options chunk), then two requests sharing the
    first one's prefix (a radix-cache hit of whole pages): each request's 6 greedy
    tokens equal transformers'."""
    shared = prompt(21, 17)
    waves = [
        {"long": shared + prompt(22, 4), "short": prompt(23, 5), "mid": prompt(24, 11)},
        {"hit1": shared + prompt(25, 3), "hit2": shared[:12] + prompt(26, 2)},
    ]
    out, cached, _ = serve_waves(runner, waves, 6)
    for rid, p in (waves[0] | waves[1]).items():
        assert out[rid] == hf_greedy(hf, p, 6), rid
    assert cached["hit1"] >= 16 and cached["hit2"] >= 8  # whole pages of the shared prefix
