"""The ranks of a tensor-parallel runner over ``torch.distributed``: the collectives the
sharded model runs (timed, for the ledger) and the step plans rank 0 broadcasts.

The compute collectives use gloo on the CPU and NCCL on CUDA (the process group's
backend follows the device); the step plans always travel over a gloo group of their
own, as msgspec-encoded bytes in a ``uint8`` tensor after an ``int64`` length (-1:
stop), so no Python object is pickled between ranks. Rank 0 hosts the rendezvous (a
``torch.distributed.TCPStore`` on 127.0.0.1, on a port the OS picks).

Three groups over the same ranks, each with its own timeout: the default group only
forms them (it waits ``TIMEOUT_S`` for the other ranks to start and join); the compute
collectives run on a group of the device's backend bounded by ``collective_timeout_s()``
(a rank that hangs is noticed within it, one that dies at once: its connection closes);
the plans travel on a gloo group where rank 0's sends are bounded the same way, while a
rank >= 1 waits for the next plan ``IDLE_TIMEOUT_S``, as long as rank 0 lives (it dies
with it), so that a server may sit idle for any time. A failed collective raises
``TPRankLost``, whose message is plain (the transport's detail is its ``__cause__``, in
the log).
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from houchu import env as env_vars
from houchu.transport.messages import SeqWork, StepPlan

#: seconds a rank waits for the others to join, and for a collective to complete
TIMEOUT_S = 300.0
#: the variable that replaces ``TIMEOUT_S`` for the collectives (tests set it)
TIMEOUT_ENV = env_vars.TP_TIMEOUT_S
#: seconds a rank >= 1 waits for the next step plan (ten years: an idle server is fine)
IDLE_TIMEOUT_S = 10 * 365 * 86400.0


def collective_timeout_s() -> float:
    """Seconds a collective may take: ``$HOUCHU_TP_TIMEOUT_S`` when set, else
    ``TIMEOUT_S`` (read at each call: every rank reads its own environment)."""
    value = env_vars.tp_timeout_s()
    return value if value is not None else TIMEOUT_S


class TPRankLost(RuntimeError):
    """A collective or a plan broadcast failed: another rank died, hung or closed its
    connection. The message is for clients ("a tensor-parallel rank stopped: ...");
    the transport's own error is the ``__cause__``."""


def rank_lost(e: BaseException, timeout_s: float) -> TPRankLost:
    """The plain ``TPRankLost`` for ``e``, a failed collective (gloo's message names its
    source file and line, then a sentence; NCCL's differ)."""
    text = str(e)
    if re.search(r"timed out|timeout", text, re.IGNORECASE):
        why = f"no answer within {timeout_s:g} s"
    elif re.search(r"Connection (closed|reset)|Read error|Broken pipe|EOF", text):
        why = "its connection closed"
    else:  # the first sentence, without gloo's "[/path/file.cc:123] "
        why = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0].strip() or type(e).__name__
    return TPRankLost(f"a tensor-parallel rank stopped: {why}")


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
    ``timeout_s``: the collectives' timeout (``collective_timeout_s``).
    """

    def __init__(self, rank: int, world: int, device: torch.device, port: int) -> None:
        self.rank, self.world, self.device, self.port = rank, world, device, port
        self.timeout_s = collective_timeout_s()
        bounded = timedelta(seconds=self.timeout_s)
        self.compute = dist.new_group(backend=backend_for(device), timeout=bounded)
        # the plans' group: rank 0 sends within the collectives' timeout, the others
        # wait for the next plan as long as rank 0 lives (each rank's own timeout)
        wait_s = self.timeout_s if rank == 0 else IDLE_TIMEOUT_S
        self.plans = dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_s))
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
        timeout = timedelta(seconds=TIMEOUT_S)  # to join; each group has its own then
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        port = store.port if isinstance(store, dist.TCPStore) else 0
        return cls(rank, world, device, port)

    def _timed(self, fn, x: torch.Tensor) -> float:  # noqa: ANN001 (a collective)
        t0 = time.perf_counter()
        try:
            fn(x)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
        except Exception as e:
            self.broken = True
            raise rank_lost(e, self.timeout_s) from e
        dt = time.perf_counter() - t0
        self._step_s += dt
        return dt

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (any shape, contiguous) over the ranks, in place; returns ``x``."""
        self.allreduce_s += self._timed(lambda t: dist.all_reduce(t, group=self.compute), x)
        self.num_allreduce += 1
        return x

    def all_gather_cols(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[R, C]`` of each rank -> ``[R, world·C]`` (rank 0's columns first)."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self.gather_s += self._timed(lambda t: dist.all_gather(parts, t, group=self.compute), x)
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
        """Rank 0: broadcast one step to the other ranks.

        Raises:
            TPRankLost: a rank is gone or did not take it within ``timeout_s``.
        """
        payload = _ENCODER.encode(step)
        self._broadcast(torch.tensor([len(payload)], dtype=torch.int64))  # [1]
        self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8))  # [n]

    def send_stop(self) -> None:
        """Rank 0: tell the other ranks to exit their loop."""
        self._broadcast(torch.tensor([-1], dtype=torch.int64))

    def recv_step(self) -> TPStep | None:
        """Ranks >= 1: the next step rank 0 broadcast (None: stop); waits for it as long
        as rank 0 lives.

        Raises:
            TPRankLost: rank 0 is gone.
        """
        header = torch.zeros(1, dtype=torch.int64)  # [1]
        n = int(self._broadcast(header).item())
        if n < 0:
            return None
        data = self._broadcast(torch.empty(n, dtype=torch.uint8))  # [n]
        return _DECODER.decode(data.numpy().tobytes())

    def _broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` (a CPU tensor) to every rank over the plans' group; returns
        ``x``, filled on ranks >= 1."""
        try:
            dist.broadcast(x, 0, group=self.plans)
        except Exception as e:
            self.broken = True
            raise rank_lost(e, self.timeout_s if self.rank == 0 else IDLE_TIMEOUT_S) from e
        return x

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


def send_pass(tp: TPGroup | None, plan: StepPlan, work: list[SeqWork], rows: list[int]) -> None:
    """Send one pass of ``plan`` (its ``work`` and prompt rows per item) to the other
    ranks of a tensor-parallel runner (``tp``; nothing when None), which run it in turn
    with rank 0: each pass is sent just before rank 0 runs it."""
    if tp is not None:
        tp.send_step(TPStep(plan=msgspec.structs.replace(plan, work=work), prompt_rows=rows))
