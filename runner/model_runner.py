"""The model runner: weights, the device KV pool, per-request sampling state, and one
``execute(StepPlan) -> StepResult`` per forward pass. No asyncio, no ZeroMQ: the runner
actor (``actors/runner.py``) wraps it.

Plan semantics (applied in this order, after the whole plan has been validated, so an
invalid plan raises ``ValueError`` and changes nothing):

1. ``release``: drop those requests' state (unknown rids are ignored; their pages are the
   scheduler's to free);
2. ``init``: register new requests (sampling params, prompt ids for penalties, seeded
   generator); a rid already registered is an error;
3. ``work``: for each ``SeqWork``, take its page table (whole, or the runner's own grown
   by ``new_pages``: ``houchu.runner.page_tables``), write the K/V of ``token_ids`` at
   positions ``start_pos .. start_pos + n - 1`` into its pages, attend causally over
   positions ``0 .. start_pos + n - 1``, and when ``sample`` is set draw the next token
   and append it to the request's generated history. Recomputing a preempted request's
   tokens appends nothing, so its penalty counts stay right. A work item with
   ``num_draft`` proposals is verified (``houchu.model.sampling.verify``): its accepted proposals and
   the token after them are appended and returned, one ``SeqOutput`` each. With an MTP
   proposer attached (``houchu.speculative.mtp``), up to ``num_propose`` proposals after the
   step's last token come back in ``StepResult.proposals``.

Overlap scheduler: a work item with ``use_last_sampled`` has a placeholder first token,
replaced by the token this runner sampled for that rid in the previous ``execute`` call
(the last one, after verification). The runner keeps only the previous call's tokens; a
call that fails keeps none, so a plan built on a failed step fails too instead of
running on a stale token. Jump-forward (``houchu.model.grammar.jump_forward``): forced tokens
follow the sampled ones (``SeqOutput.forced``); a step planned before them draws nothing.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Protocol

import torch
from msgspec import structs

from houchu.cache_tiers.host_pool import HostPool
from houchu.cpu import kernels as cpu_kernels
from houchu.cpu.fused_layers import FusedDecode
from houchu.cpu.threads import step_key
from houchu.gpu.memory import cuda_device_facts
from houchu.model.attention.window import WindowLedger
from houchu.model.batch import StepBatch, build_batch
from houchu.model.config.core import ModelConfig, num_parameters
from houchu.model.device import make_current, resolve_device
from houchu.model.grammar.catch_up import split_passes
from houchu.model.grammar.jump_forward import JumpForward, drop_stale_samples
from houchu.model.grammar.matcher import GrammarEngine, RequestGrammar
from houchu.model.kv.transfer import HostKVMirror
from houchu.model.moe import MoEMLP, moe_lever_sample
from houchu.model.sampling.prompt_logprobs import rows_wanted, score
from houchu.model.sampling.sampler import RequestState, Sampler
from houchu.model.sampling.verify import sample_and_verify
from houchu.model.weights.loader import parse_dtype
from houchu.options.runner_options import RunnerOptions
from houchu.runner.backends import make_backend, make_ops
from houchu.runner.choices import resolve_attention, resolve_dtype
from houchu.runner.deterministic import deterministic_options, pin, pinned_notes
from houchu.runner.load import load_runner_model
from houchu.runner.mla_lever import MLALever, mla_levers_note, mla_summary
from houchu.runner.page_tables import PageTables
from houchu.runner.plan_state import (
    compile_grammars,
    live_state,
    new_states,
    prompt_chunk_rids,
    resolve_last_sampled,
    seq_outputs,
)
from houchu.runner.report import (
    cuda_graph_clause,
    decode_paths_text,
    device_clause,
    matmul_note,
)
from houchu.runner.setup import RunnerSetup, make_kv_pool
from houchu.runner.structure_levers import structure_notes
from houchu.runner.tensor_parallel.group import TPGroup, send_pass
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.messages import (
    PromptLogprobs,
    RunnerInfo,
    SeqOutput,
    StepPlan,
    StepResult,
)
from houchu.transport.step_messages import SeqWork
from houchu.transport.telemetry import LeverSample


class InRunnerProposer(Protocol):
    """Proposals made inside the runner, beside the target's pass (the checkpoint's MTP
    layer: ``houchu.speculative.mtp.MTPDrafter``, which ``attach_mtp`` sets as
    ``ModelRunner.mtp``)."""

    def target_logits(self, batch: StepBatch) -> torch.Tensor:
        """The target's pass over ``batch``: logits ``[R, vocab]`` of its sampled rows."""

    def forget(self) -> None:
        """Drop every request's pending state (their scheduler is gone)."""

    def step(
        self, plan: StepPlan, batch: StepBatch | None, outputs: list[SeqOutput]
    ) -> tuple[dict[str, list[int]], float]:
        """After the target's pass: each request's proposals and the seconds spent."""


class ModelRunner:
    """Owns a Llama model and its KV pool; executes step plans.

    Args:
        model_path: a ``.gguf`` file or a Hugging Face Llama directory.
        options: how to load and run it (``houchu.options.runner_options.RunnerOptions``: the
            device, dtype, KV pool, threads, quantization, kernels and compiled step;
            ``houchu serve``'s "model runner" flags; None: their defaults).
        seed: seed of the generator unseeded requests share (None: random).
        logprobs_mode: "raw" (log_softmax of the model's logits, vLLM's default) or
            "processed" (after penalties, temperature and filters).
        prepack: on CPU, keep matmul weights in oneDNN's packed layout (faster).
        quiet: do not print the load summary.
        tp: this process's rank of a tensor-parallel group (ranks >= 1,
            ``houchu.runner.tensor_parallel.worker``); None with ``options.tensor_parallel_size`` > 1:
            this is rank 0, which starts the other ranks.
    Raises:
        houchu.model.device.DeviceError: a device torch cannot use here.
        ModelLoadError: the model cannot be loaded.
        ValueError: an option outside its bounds or choices (``RunnerOptions.checked``, a
            ``msgspec.ValidationError`` naming the field), a CPU ISA level this CPU does
            not run, or a KV budget below one page; ``TensorParallelError``: a model or
            option that cannot run at ``options.tensor_parallel_size``.
        RuntimeError: a backend that cannot run here (flash-attn or Triton missing).
    """

    def __init__(
        self,
        model_path: str | Path,
        options: RunnerOptions | None = None,
        *,
        seed: int | None = None,
        logprobs_mode: str = "raw",
        prepack: bool = True,
        quiet: bool = False,
        tp: TPGroup | None = None,
    ) -> None:
        # the one check of the options' bounds: they may have been built in Python
        # (tests, benches) rather than decoded; from here on they are trusted
        o = self.options = (options if options is not None else RunnerOptions()).checked()
        self.tp: TPGroup | None = None  # tensor parallel: this process's rank
        tp_notes: list[str] = []
        if o.tensor_parallel_size > 1:
            from houchu.runner.tensor_parallel.ranks import start_tp, tp_runner_options

            o, tp_notes = tp_runner_options(o)
            self.options = o
            self.tp = tp if tp is not None else start_tp(model_path, o)
        # a rank runs on its group's device (cuda:RANK on CUDA; ``--device`` says "cuda")
        # and the current CUDA device: graphs are captured and Triton launches there
        self.device = make_current(self.tp.device if self.tp else resolve_device(o.device))
        if o.deterministic:  # checked, then as the mode runs: houchu.runner.deterministic
            o = self.options = deterministic_options(o, self.device)
        if o.threads is not None:
            torch.set_num_threads(o.threads)
        self.cpu_isa = cpu_kernels.select(o.cpu_isa)
        t0 = time.perf_counter()
        o, dtype_note = resolve_dtype(o, self.device)  # "auto": bf16 on CUDA, fp32 on CPU
        self.dtype = parse_dtype(o.dtype)
        self.model, quant = load_runner_model(
            model_path, o, self.dtype, self.device, prepack, self.tp
        )
        o, attn_note = resolve_attention(o, self.device, self.config.is_mla)
        self.options = o  # dtype, page size and (on CUDA) attention backend concrete
        #: what "auto" chose on this device, said on the start-up line
        self.choices = [c for c in (dtype_note, attn_note) if c]
        self.backend = make_backend(
            o.attention_backend, self.device, page_size=o.page_size, kv_dtype=o.kv_cache_dtype
        )
        on_cuda = self.device.type == "cuda"
        graphs = not o.disable_cuda_graph and on_cuda
        self.device_facts = cuda_device_facts(self.device) if on_cuda else None  # GPU, memory
        with torch.inference_mode():
            for m in self.model.modules():  # layers built before the kernels were loaded
                if hasattr(m, "prepare_cpu_gemv"):
                    m.prepare_cpu_gemv()
            self.model.ops = make_ops(self.backend.ops_name, self.device)
            if (
                not o.disable_fused_layers
                and self.backend.name == "cpu"
                and self.config.plain_llama_layers
            ):
                self.model.fused = FusedDecode(self.model)
            kv_dtype = o.kv_cache_dtype
            if self.config.is_mla:  # a pool of latents; what does not apply, said
                kv_dtype = mla_levers_note(self.config, o, self.backend.name)
            self.pool, self.pool_size = make_kv_pool(  # how it was sized: pool_size.source
                self.config, o, self.dtype, self.device, kv_dtype, int(graphs), self.device_facts
            )
        buckets = tuple(o.decode_batch_sizes)
        self.deterministic = pin(self.model, buckets, self.backend) if o.deterministic else ""
        setup = RunnerSetup(
            self.model, self.dtype, self.device, self.pool, self.backend, model_path, quant, buckets
        )
        self.tuned = (
            setup.tune() if o.decode_paths == "auto" and self.device.type == "cpu" else None
        )
        self.accel = setup.accelerator(o.compile, graphs, self.tuned)
        if self.tp is not None:
            self.tp.reset()  # the warm-up steps are not served steps
        self.levers = setup.levers(self.accel, kv_dtype)
        per_layer = self.pool.bytes_per_token // max(self.config.num_layers, 1)
        self.window_ledger = WindowLedger(self.model.attention, per_layer)
        structure = (self.model.attention, self.backend.name, not o.disable_fused_layers)
        notes = structure_notes(
            self.config, *structure, quant.mode, quant.int4_method, self.model.rounded_int4
        )
        self.notes = tp_notes + pinned_notes(self.deterministic) + self.model.load_notes
        self.notes += notes + self.pool_size.notes  # what the structure and the pool limit
        self.sampler = Sampler(self.device, seed=seed, logprobs_mode=logprobs_mode)
        limit = min(self.config.max_position, self.pool.num_tokens)
        self.max_context = limit if o.max_context is None else min(o.max_context, limit)
        self.states: dict[str, RequestState] = {}
        self.page_tables = PageTables()  # each request's, between steps
        #: structured output: the grammar of each constrained request (rid -> matcher)
        self.grammar = GrammarEngine(model_path, self.config.vocab_size)
        self.grammars: dict[str, RequestGrammar] = {}
        self.jump = JumpForward(o.jump_forward == "on")  # structured-output jump-forward
        self.last_sampled: dict[str, int] = {}  # rid -> token sampled by the previous call
        self.prompt_rids: set[str] = set()  # the step's prompt chunks (``prompt_chunk_rids``)
        self.host_kv: HostKVMirror | None = None  # the shared host KV pool, when tiers are on
        self.mtp: InRunnerProposer | None = (
            None  # in-runner MTP proposals (speculative.mtp.attach_mtp)
        )
        self.num_params = self.model.num_params()
        on_cpu = self.device.type == "cpu" and not o.fixed_threads
        self.governor = setup.governor(self.tuned) if on_cpu else None  # cached thread counts
        self.notes += self.governor.start_notes() if self.governor else []
        # an MLA model's pool is a LatentKVPool (``KVPool.for_model``)
        self.mla_lever = MLALever(self.pool, self.max_context) if self.config.is_mla else None
        if not quiet:
            print(self.summary(time.perf_counter() - t0), flush=True)
            for note in self.notes:
                print(f"houchu runner: {note}", flush=True)

    @property
    def config(self) -> ModelConfig:
        """The model's configuration."""
        return self.model.cfg

    def summary(self, load_s: float | None = None) -> str:
        """The start-up line: architecture, parameters, dtype, the device (on CUDA the
        GPU's name and memory), KV pool geometry and bytes and which option sized it, the
        attention backend and CUDA graphs, kernels, threads, the levers' summary, the
        measured decode paths and what "auto" chose on this device. ``load_s``: seconds
        the load took (None: not said)."""
        p = self.pool
        took = "" if load_s is None else f" (loaded in {load_s:.1f}s)"
        static = getattr(self.backend, "supports_static", False)
        disabled = self.options.disable_cuda_graph
        # the batch buckets the CUDA graphs were captured for (the options' otherwise)
        buckets = tuple(getattr(self.accel.impl, "buckets", self.options.decode_batch_sizes))
        graphs = cuda_graph_clause(self.device.type, self.accel.kind, buckets, disabled, static)
        build_s = getattr(self.backend, "build_s", 0.0)
        built = f" (C++ kernels built in {build_s:.0f}s)" if build_s >= 1.0 else ""
        fused = self.model.fused is not None and self.model.fused.applies(1)
        return (
            f"houchu runner: {self.config.architecture} {self.config.name!r}, "
            f"{self.num_params / 1e6:.1f}M params ({matmul_note(self.config)}), "
            f"{str(self.dtype).removeprefix('torch.')} on "
            f"{device_clause(self.device, self.device_facts)}, "
            f"{self.config.num_layers} layers, KV pool {p.num_pages} pages x {p.page_size} = "
            f"{p.num_tokens} tokens, {p.num_bytes / 2**20:.1f} MiB "
            f"({p.bytes_per_token} B/token) sized by {self.pool_size.source}, "
            f"max context {self.max_context}, attention {self.backend.name}"
            f"{', ' + graphs if graphs else ''}, kernels {self.model.ops.name} "
            f"(CPU ISA {self.cpu_isa}){built}"
            f"{' with fused decode layers' if fused else ''}, "
            f"matmul {'onednn-packed' if self.model.prepacked else 'dense'}, "
            f"{torch.get_num_threads()} threads{took}; {self.levers.summary()}"
            f"{'; decode paths ' + self.decode_paths() if self.tuned else ''}"
            f"{'; ' + mla_summary(p, self.max_context) if self.mla_lever else ''}"
            f"{''.join('; ' + c for c in self.choices)}"
        )

    def _build(self, work: list[SeqWork], prompt_rows: list[int]) -> StepBatch:
        """The batch of ``work`` (``build_batch`` on this runner's pool and limits), its
        prompt chunks marked (``StepBatch.prompt_seqs``: the plan's ``prompt_rids``)."""
        b = build_batch(
            work,
            page_size=self.pool.page_size,
            num_pages=self.pool.num_pages,
            max_context=self.max_context,
            vocab_size=self.config.vocab_size,
            device=self.device,
            prompt_rows=prompt_rows,
        )
        b.prompt_seqs = frozenset(i for i, w in enumerate(work) if w.rid in self.prompt_rids)
        return b

    def _timed_forward(self, batch: StepBatch) -> torch.Tensor:
        """``_forward``, with the thread governor told about the step."""
        if self.governor is None:
            return self._forward(batch)
        n = batch.num_tokens
        key = step_key(n, all_decode=n == batch.num_seqs)
        return self.governor.run(lambda: self._forward(batch), key, n)

    def lever_samples(self) -> list[LeverSample]:
        """What the runner's levers saved and spent since the previous call
        (engine-wide ``LeverSample``s, for the runner actor to emit): weight and KV
        quantization, 16-bit compute, the compiled / graph-captured decode step, MoE
        routing, MLA, sliding windows, structured output, tensor parallel."""
        out = [*self.levers.samples(), *self.grammar.samples(), *self.jump.samples()]
        now = time.time()
        if self.tp is not None:
            from houchu.runner.tensor_parallel.shards import tp_lever_sample

            out.append(tp_lever_sample(self.tp, self.model.weight_bytes()[0], now))
        moes = (m for m in self.model.modules() if isinstance(m, MoEMLP))
        moe = moe_lever_sample(moes, now)
        if self.mla_lever is not None:
            out += self.mla_lever.samples(now)
        if moe is not None:
            out.append(moe)
        skipped = self.window_ledger.take()
        if skipped:
            out.append(
                LeverSample(
                    Lever.SLIDING_WINDOW_ATTENTION,
                    Verb.MOVE_LESS,
                    skipped,
                    Unit.BYTES,
                    0.0,
                    Unit.NONE,
                    now,
                )
            )
        return out

    def attach_host_pool(self, host: HostPool) -> None:
        """Map the shared host KV pool so plans can save pages to it and load them back.

        Raises:
            ValueError: its slots are smaller than one device page, or the runner is
                tensor-parallel (each rank holds a slice of every page).
        """
        if self.tp is not None:
            raise ValueError("the KV tiers do not combine with --tensor-parallel-size > 1")
        self.host_kv = HostKVMirror(self.pool, host)

    def forget_requests(self) -> None:
        """Drop every request's sampling state, page table and grammar (their scheduler is
        gone)."""
        self.states.clear()
        self.page_tables.clear()
        self.grammars.clear()
        if self.mtp is not None:
            self.mtp.forget()

    def close(self) -> None:
        """Stop the other ranks of a tensor-parallel runner; unpin the host KV tier."""
        if self.host_kv is not None:
            self.host_kv.close()
        if self.tp is not None and self.tp.rank == 0:
            from houchu.runner.tensor_parallel.ranks import stop_ranks

            stop_ranks(self.tp)
            self.tp = None

    def info(self) -> RunnerInfo:
        """What the scheduler needs to know about this runner, and the limits every
        request must fit (``houchu.transport.limits``)."""
        c = self.config if self.tp is None else self.model.full_cfg
        ranks = 1 if self.tp is None else self.tp.world  # each holds 1/ranks of the KV
        return RunnerInfo(
            num_pages=self.pool.num_pages,
            page_size=self.pool.page_size,
            max_context=self.max_context,
            kv_bytes_per_token=self.pool.bytes_per_token * ranks,
            num_params=self.num_params,
            model_name=self.config.name,
            num_nonembed_params=num_parameters(c).non_embedding,
            attn_flops_per_pair=4 * c.num_layers * c.num_heads * c.head_dim,
            vocab_size=c.vocab_size,
            device_type=self.device.type,
            num_threads=torch.get_num_threads(),
            cpu_isa=self.cpu_isa if self.device.type == "cpu" else "",
            decode_paths=decode_paths_text(self.tuned),
            deterministic=self.deterministic,
            sliding_window=c.sliding_window if c.every_layer_windowed else 0,
        )

    def decode_paths(self) -> str:
        """The measured decode path per bucket and the times measured ("" when not
        tuned), e.g. "b<=1 fused 2.4 ms (gemv 3.1, torch 9.0, dense 21.0); ..."."""
        return decode_paths_text(self.tuned)

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        """Logits ``[R, V]`` float32 of one step, accelerated where possible (eager with
        an MTP proposer, which keeps the hidden states); counts it."""
        logits = self.accel.forward(batch) if self.mtp is None else self.mtp.target_logits(batch)
        fast = logits is not None and self.mtp is None
        if logits is None:
            logits = self.model(batch, self.pool, self.backend)
        pairs = batch.attention_pairs() if self.levers.cost.score_pair_bytes else 0
        read = self.model.weight_bytes_at(batch.num_tokens, int(batch.sample_rows.numel()))
        self.levers.record(batch.num_tokens, sum(batch.kv_lens), fast, read, pairs)
        if self.mla_lever is not None:
            self.mla_lever.record(batch.num_tokens)
        self.window_ledger.record(batch.start_pos)
        return logits

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step (see the module docstring for the semantics).

        Returns:
            ``StepResult`` with one ``SeqOutput`` per sampled request, in work order;
            ``num_tokens`` = new tokens computed; ``duration_s`` = seconds spent;
            ``failures``: the requests that fail alone (a grammar that does not compile
            on the model's tokenizer, or a matcher llguidance stopped following).
        Raises:
            ValueError: unknown rid in work, duplicate init, invalid sampling params,
                empty token list, token id out of vocab, positions beyond
                ``max_context``, a page table too short or naming a page outside the
                pool, or two tokens writing one KV slot, or a placeholder token
                (``use_last_sampled``) for a rid the previous step sampled nothing for.
                Nothing is changed then (except that the previous step's sampled tokens
                are forgotten).
        """
        t0 = time.perf_counter()
        started_at = time.time()
        previous, self.last_sampled = self.last_sampled, {}
        with torch.inference_mode():
            # ---- validate everything before touching state
            resolve_last_sampled(plan, previous)
            new = new_states(plan, self.states, self.config.vocab_size, self.device)
            work, tables = self.page_tables.resolve(plan.work, plan.release)
            plan = structs.replace(plan, work=work)  # whole page tables from here on
            new_grammars, failures = compile_grammars(self.grammar, plan.init)
            state_of = partial(live_state, states=self.states, new=new)
            forced = self.jump.take_forced_rids()  # the overlap step planned before them
            stale = drop_stale_samples(plan, state_of, forced)
            scored = [rows_wanted(w, state_of(w.rid)) for w in plan.work]  # (rows, first pos)
            prompt_rows = [n for n, _ in scored]
            self.prompt_rids = prompt_chunk_rids(plan, state_of)
            batch = self._build(plan.work, prompt_rows) if plan.work else None
            passes = None  # jump-forward's catch-up tokens beside free requests: two passes
            if batch is not None and self.mtp is None:
                grammared = self.grammars.keys() | new_grammars.keys()
                passes = split_passes(plan.work, prompt_rows, state_of, grammared, stale)
            if self.host_kv is not None:
                self.host_kv.check(plan.kv_saves)
                self.host_kv.check(plan.kv_loads)
            elif plan.kv_saves or plan.kv_loads:
                raise ValueError("plan copies KV pages but no host pool is attached")
            send = partial(send_pass, self.tp, plan)  # a tensor-parallel runner's other ranks
            if batch is not None:  # run it too
                send(*(passes.parts()[0] if passes else (plan.work, prompt_rows)))
            # ---- commit
            if self.host_kv is not None:
                self.host_kv.save(plan.kv_saves)
                self.host_kv.load(plan.kv_loads)
            for rid in plan.release:
                self.states.pop(rid, None)
                self.grammars.pop(rid, None)
            self.page_tables.commit(tables, plan.release)
            self.states.update(new)
            self.grammars.update(new_grammars)
            outputs = []
            prompt_lps: list[PromptLogprobs] = []
            forward_s = sample_s = 0.0  # the token path's timings (StepResult)
            if batch is not None:
                ws = [plan.work[i] for i in batch.sampled]
                states = [self.states[w.rid] for w in ws]
                drafts = [w.token_ids[len(w.token_ids) - w.num_draft :] for w in ws]
                grammars = [self.grammars.get(w.rid) for w in ws]
                # the grammar masks are computed while the model runs
                masking = self.grammar.start(grammars, batch.sample_counts, drafts)
                t_forward = time.perf_counter()
                if passes is None:
                    logits = self._timed_forward(batch)  # [R, V] fp32
                else:  # the same rows; the catch-up tokens in a pass of their own
                    logits = passes.run(batch, self._build, self._timed_forward, self.jump, send)
                forward_s = time.perf_counter() - t_forward
                if batch.prompt_spans:
                    spans = [(row, n, scored[i][1]) for i, row, n in batch.prompt_spans]
                    owners = [self.states[plan.work[i].rid] for i, _, _ in batch.prompt_spans]
                    prompt_lps = score(logits, spans, owners)
                    logits = logits.index_select(0, batch.sample_select)  # [R_sampled, V]
                masks = None if masking is None else masking.wait(logits.shape[1], self.device)
                t_sample = time.perf_counter()
                samples = sample_and_verify(
                    self.sampler, logits, batch.sample_counts, states, drafts, masks
                )  # appends each emitted token to its request's state
                sample_s = time.perf_counter() - t_sample
                ids = [[s.token_id for s in ss] for ss in samples]
                forced = self.jump.commit(grammars, states, ids, failures)  # jump-forward
                outputs = seq_outputs(states, samples, forced)
            proposals, draft_s = self.mtp.step(plan, batch, outputs) if self.mtp else ({}, 0.0)
        if self.host_kv is not None:  # the host slots are read / refilled once it returns
            self.host_kv.finish()
        # the last token drawn per rid (a placeholder's value; forced tokens come after)
        self.last_sampled = {o.rid: o.token_id for o in outputs if not o.forced}
        return StepResult(
            step_id=plan.step_id,
            outputs=outputs,
            duration_s=time.perf_counter() - t0,
            num_tokens=0 if batch is None else batch.num_tokens,
            started_at=started_at,
            prompt_logprobs=prompt_lps,
            allreduce_s=0.0 if self.tp is None else self.tp.take(),
            failures=failures,
            proposals=proposals,
            draft_s=draft_s,
            forward_s=forward_s,
            sample_s=sample_s,
        )
