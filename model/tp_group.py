"""The ranks of a tensor-parallel runner over ``torch.distributed``: the collectives the
sharded model runs (timed, for the ledger) and the step plans rank 0 broadcasts.

The compute collectives use gloo on the CPU and NCCL on CUDA (the process group's
backend follows the device); the step plans always travel over a gloo group, as
msgspec-encoded bytes in a ``uint8`` tensor after an ``int64`` length (-1: stop), so no
Python object is pickled between ranks. Rank 0 hosts the rendezvous (a
``torch.distributed.TCPStore`` on 127.0.0.1, on a port the OS picks).
"""

from __future__ import annotations

import time
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from houchu.transport.messages import StepPlan

#: seconds a rank waits for the others to join, and for a collective to complete
TIMEOUT_S = 300.0


class TPStep(msgspec.Struct, kw_only=True):
    """One step for the other ranks: the plan (placeholders resolved by rank 0) and the
    prompt rows scored per work item (so every rank builds the same batch)."""

    plan: StepPlan
    prompt_rows: list[int]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(TPStep)


class TPGroup:
    """This process's rank in a group of ``world`` ranks.

    Build with ``TPGroup.join``. ``allreduce_s``
    and ``gather_s`` total the seconds spent inside the collectives (on CUDA measured up
    to the op's completion); ``take()`` returns and resets the per-step share.
    """

    def __init__(self, rank: int, world: int, device: torch.device, port: int) -> None:
        self.rank, self.world, self.device, self.port = rank, world, device, port
        self.control = dist.new_group(backend="gloo") if device.type == "cuda" else None
        self.allreduce_s = 0.0  # since start
        self.gather_s = 0.0
        self.num_allreduce = 0
        self._step_s = 0.0  # since the last take()
        self._ledger_steps, self._ledger_s = 0, 0.0  # since the last take_ledger()
        self.broken = False  # a collective failed: a rank is gone

    @classmethod
    def join(cls, rank: int, world: int, store: dist.Store, device: torch.device) -> TPGroup:
        """Form the process group with the other ranks (blocks until all have joined).

        Args:
            rank: this process's rank; 0 hosts ``store`` (``host_store``), the others
                reach it (``dist.TCPStore("127.0.0.1", port, world)``).
            world: ranks in all.
            store: the rendezvous.
            device: this rank's device (CUDA: NCCL, else gloo).
        Raises:
            RuntimeError: a rank did not join within ``TIMEOUT_S``.
        """
        backend = backend_for(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=TIMEOUT_S)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        port = store.port if isinstance(store, dist.TCPStore) else 0
        return cls(rank, world, device, port)

    def _timed(self, fn, x: torch.Tensor) -> float:  # noqa: ANN001 (a collective)
        t0 = time.perf_counter()
        try:
            fn(x)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
        except Exception:
            self.broken = True
            raise
        dt = time.perf_counter() - t0
        self._step_s += dt
        return dt

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (any shape, contiguous) over the ranks, in place; returns ``x``."""
        self.allreduce_s += self._timed(dist.all_reduce, x)
        self.num_allreduce += 1
        return x

    def all_gather_cols(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[R, C]`` of each rank -> ``[R, world·C]`` (rank 0's columns first)."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self.gather_s += self._timed(lambda t: dist.all_gather(parts, t), x)
        return torch.cat(parts, dim=1)

    def take(self) -> float:
        """Seconds spent in collectives since the previous call (one step's)."""
        s, self._step_s = self._step_s, 0.0
        self._ledger_steps += 1
        self._ledger_s += s
        return s

    def reset(self) -> None:
        """Forget the collectives so far (the start-up warm-up steps)."""
        self._step_s, self._ledger_steps, self._ledger_s = 0.0, 0, 0.0
        self.allreduce_s = self.gather_s = 0.0
        self.num_allreduce = 0

    def take_ledger(self) -> tuple[int, float]:
        """``(steps, collective seconds)`` since the previous call (``take`` counts)."""
        out = (self._ledger_steps, self._ledger_s)
        self._ledger_steps, self._ledger_s = 0, 0.0
        return out

    def send_step(self, step: TPStep) -> None:
        """Rank 0: broadcast one step to the other ranks."""
        payload = _ENCODER.encode(step)
        self._broadcast_header(len(payload))
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # [n]
        dist.broadcast(data, 0, group=self.control)

    def send_stop(self) -> None:
        """Rank 0: tell the other ranks to exit their loop."""
        self._broadcast_header(-1)

    def recv_step(self) -> TPStep | None:
        """Ranks >= 1: the next step rank 0 broadcast (None: stop)."""
        n = self._broadcast_header(0)
        if n < 0:
            return None
        data = torch.empty(n, dtype=torch.uint8)  # [n]
        dist.broadcast(data, 0, group=self.control)
        return _DECODER.decode(data.numpy().tobytes())

    def _broadcast_header(self, n: int) -> int:
        header = torch.tensor([n], dtype=torch.int64)  # [1]
        try:
            dist.broadcast(header, 0, group=self.control)
        except Exception:
            self.broken = True
            raise
        return int(header.item())

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()


def backend_for(device: torch.device) -> str:
    """The ``torch.distributed`` backend of the compute collectives on ``device``:
    "nccl" on CUDA, else "gloo".

    Raises:
        RuntimeError: CUDA without NCCL in this torch build.
    """
    if device.type != "cuda":
        return "gloo"
    if not dist.is_nccl_available():
        raise RuntimeError("tensor parallel on CUDA needs torch built with NCCL")
    return "nccl"


def host_store(world: int) -> dist.TCPStore:
    """Rank 0's rendezvous: a ``TCPStore`` on 127.0.0.1 on a port the OS picks
    (``store.port``, for the other ranks)."""
    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)


def client_store(port: int, world: int) -> dist.TCPStore:
    """A rank >= 1's connection to rank 0's rendezvous on ``port``."""
    timeout = timedelta(seconds=TIMEOUT_S)
    return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
