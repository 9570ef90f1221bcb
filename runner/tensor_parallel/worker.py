"""The ranks of a tensor-parallel runner besides rank 0: started by rank 0's
``ModelRunner`` (``houchu.runner.tensor_parallel.ranks.start_ranks``), each a
``python -m houchu.runner.tensor_parallel.worker`` process that loads its shard and
runs every step rank 0 broadcasts (the forward pass only: its KV heads' writes and its
share of the collectives; rank 0 alone samples and talks to the scheduler). A rank dies with rank 0's process (``PR_SET_PDEATHSIG``) and exits when
rank 0 closes the group.
"""

from __future__ import annotations

import contextlib
import signal
import sys

import msgspec
import torch

from houchu.model.batch import build_batch
from houchu.runner.model_runner import ModelRunner
from houchu.runner.tensor_parallel.group import (
    TPGroup,
    TPRankLost,
    TPStep,
    client_store,
)
from houchu.runner.tensor_parallel.ranks import WorkerSpec, rank_device


def run_rank(spec: WorkerSpec) -> None:
    """A rank >= 1: join, load the shard, run broadcast steps until told to stop."""
    device = torch.device(rank_device(spec.options, spec.rank))
    group = TPGroup.join(
        spec.rank,
        spec.world,
        client_store(spec.port, spec.world),
        device,
    )
    # rank 0's options as they are (``--device cuda``, not ``cuda:RANK``, which
    # ``tp_runner_options`` refuses): the runner takes its device from the group
    runner = ModelRunner(spec.model, spec.options, tp=group, quiet=True)
    with torch.inference_mode():
        while (step := _next_step(group)) is not None:
            batch = build_batch(
                step.plan.work,
                page_size=runner.pool.page_size,
                num_pages=runner.pool.num_pages,
                max_context=runner.max_context,
                vocab_size=runner.config.vocab_size,
                device=runner.device,
                prompt_rows=step.prompt_rows,
            )
            runner.model(batch, runner.pool, runner.backend)
    group.close()


def _next_step(group: TPGroup) -> TPStep | None:
    """The next step rank 0 broadcast; when rank 0 is gone (``TPRankLost``), one line
    and exit status 1, not a traceback (rank 0's runner restarts every rank)."""
    try:
        return group.recv_step()
    except TPRankLost as e:
        print(f"houchu tp rank {group.rank}: {e}; exiting", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _die_with_parent() -> None:
    """On Linux, SIGTERM this process when rank 0's process dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def main() -> None:
    """``python -m houchu.runner.tensor_parallel.worker`` with a ``WorkerSpec`` as JSON on stdin."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's
    spec = msgspec.json.decode(sys.stdin.buffer.read(), type=WorkerSpec)
    run_rank(spec)


if __name__ == "__main__":
    main()
