"""Rank 0's side of a tensor-parallel runner's other ranks: which options every rank runs
with (``tp_runner_options``), starting ranks 1..N-1 (``start_ranks``, each a
``python -m houchu.runner.tensor_parallel.worker`` process), watching and ending them.

``tp_runner_options`` are the runner options every rank runs with: the levers that hold
no collectives (the compiled step, the fused C++ decode layers, CUDA graphs, the decode
paths measured on one rank) are off, said at startup, or refused when asked for.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import torch

from houchu import env as env_vars
from houchu.options.runner_options import RunnerOptions
from houchu.runner.tensor_parallel.group import TPGroup, host_store
from houchu.runner.tensor_parallel.shards import TensorParallelError, check_shardable

#: set (to anything) to run more CPU ranks than cores (they share them; for tests)


class WorkerSpec(msgspec.Struct, kw_only=True):
    """What a rank >= 1 needs, on its stdin as JSON."""

    model: str
    options: RunnerOptions
    rank: int
    world: int
    port: int


def rank_device(options: RunnerOptions, rank: int) -> str:
    """Rank ``rank``'s ``--device``: ``cuda:RANK`` on CUDA, else the CPU."""
    from houchu.model.device import resolve_device

    dev = torch.device(resolve_device(options.device))
    return f"cuda:{rank}" if dev.type == "cuda" else "cpu"


def tp_runner_options(o: RunnerOptions) -> tuple[RunnerOptions, list[str]]:
    """The options every rank of a ``tensor_parallel_size`` > 1 runner uses, and what
    changed (one line each, for the startup notes).

    Raises:
        TensorParallelError: a lever asked for that cannot combine with tp > 1, a CUDA
            device index with tp > 1, more ranks than GPUs or than CPU cores (unless
            ``$HOUCHU_TP_OVERSUBSCRIBE`` is set).
    """
    n = o.tensor_parallel_size
    flag = f"--tensor-parallel-size {n}"
    if o.compile == "on":
        raise TensorParallelError(f"{flag}: --compile on is not supported (the step is eager)")
    if o.device.startswith("cuda:"):
        raise TensorParallelError(f"{flag}: give --device cuda (rank r runs on cuda:r)")
    dev = torch.device(rank_device(o, 0))
    if dev.type == "cuda" and n > torch.cuda.device_count():
        raise TensorParallelError(f"{flag}: only {torch.cuda.device_count()} GPUs")
    if dev.type == "cuda" and o.mem_fraction_static is not None and o.num_pages is None:
        # each rank would size its pool from its own GPU's free memory: they could differ
        raise TensorParallelError(
            f"{flag}: --mem-fraction-static is not supported yet (the ranks' pools must "
            "match): size the pool with --kv-cache-mb or --num-pages"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if dev.type == "cpu" and n > cores and not env_vars.tp_oversubscribe():
        raise TensorParallelError(
            f"{flag}: more ranks than the {cores} CPU cores here ({env_vars.TP_OVERSUBSCRIBE}=1 runs "
            "them anyway, slowly)"
        )
    threads = o.threads if o.threads is not None else max(1, cores // n)
    notes = [
        f"tensor parallel: {n} ranks ({'NCCL' if dev.type == 'cuda' else 'gloo'}), "
        f"{threads} threads each, each rank's KV pool (the B/token above) holding 1/{n} "
        "of the KV heads; eager step (no compiled step, fused decode layers or CUDA "
        "graphs), fixed decode paths"
        + (
            "; int4 layers take float activations (int8 activations of a shard would "
            "quantize each rank's slice apart)"
            if o.int4_activations == "auto"
            else ""
        )
    ]
    changed = msgspec.structs.replace(
        o,
        threads=threads,
        fixed_threads=True,
        compile="off",
        decode_paths="rules",
        disable_fused_layers=True,
        disable_cuda_graph=True,
        int4_activations="float" if o.int4_activations == "auto" else o.int4_activations,
    )
    return changed, notes


def start_tp(model: str | Path, options: RunnerOptions) -> TPGroup:
    """Rank 0: check that the model shards over ``options.tensor_parallel_size`` ranks,
    then ``start_ranks``.

    Raises:
        TensorParallelError: it does not (``check_shardable``).
        ModelLoadError: the model's configuration cannot be read.
    """
    check_model(model, options)
    return start_ranks(model, options)


def check_model(model: str | Path, options: RunnerOptions) -> None:
    """Raise ``TensorParallelError`` unless the model at ``model`` shards over
    ``options.tensor_parallel_size`` ranks with ``options``' quantization (reads the
    configuration only)."""
    from houchu.model.config.core import resolve_model_file
    from houchu.model.config.load import load_model_config
    from houchu.model.quant.functions import QuantSpec
    from houchu.model.quant.mode import resolve_quant_mode

    cfg = load_model_config(model)
    mode = resolve_quant_mode(options.quantization, resolve_model_file(model))
    quant = QuantSpec(mode, options.quant_group_size, "float")
    check_shardable(cfg, options.tensor_parallel_size, quant)


def start_ranks(model: str | Path, options: RunnerOptions) -> TPGroup:
    """Rank 0: start ranks 1 .. N-1 and form the group with them (blocks until each has
    joined; their loading goes on meanwhile).

    Raises:
        RuntimeError: a rank did not join (it failed to start: its error is on stderr).
    """
    world = options.tensor_parallel_size
    store = host_store(world)
    procs = []
    for rank in range(1, world):
        spec = WorkerSpec(
            model=str(model), options=options, rank=rank, world=world, port=store.port
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "houchu.runner.tensor_parallel.worker"], stdin=subprocess.PIPE
        )
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(msgspec.json.encode(spec))
            proc.stdin.close()
        procs.append(proc)
    group = TPGroup.join(0, world, store, torch.device(rank_device(options, 0)))
    group.procs = procs  # type: ignore[attr-defined]
    group.store = store  # type: ignore[attr-defined]
    return group


def dead_rank(group: TPGroup) -> str | None:
    """Rank 0, between steps: a line naming the first rank >= 1 whose process has
    exited (its rank and exit status), or None while every rank lives."""
    for rank, proc in enumerate(getattr(group, "procs", []), start=1):
        if proc.poll() is not None:
            return f"tensor-parallel rank {rank} exited (status {proc.returncode})"
    return None


def kill_ranks(group: TPGroup) -> None:
    """Rank 0, about to exit after a rank was lost: SIGKILL every rank >= 1 still
    running (a stopped or hung one too, which no message would reach) and reap it."""
    for proc in getattr(group, "procs", []):
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def stop_ranks(group: TPGroup) -> None:
    """Rank 0: tell the other ranks to exit, wait briefly, then end any left (SIGTERM,
    then SIGKILL, which also ends a stopped or hung rank)."""
    with contextlib.suppress(Exception):
        if not group.broken:
            group.send_stop()
    for proc in getattr(group, "procs", []):
        for end in (proc.terminate, proc.kill):
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                end()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    group.close()
