"""The timestamps a step's tokens carry on their way to the client (``StepStamps``).

Every step's tokens travel runner -> scheduler -> tokenizer -> gateway, and each actor
stamps the moment it received and handed on the step's message, with ``time.time()``
(CLOCK_REALTIME, one clock for every process of the host, so that differences across
processes are durations). The scheduler builds a ``StepStamps`` from the runner's
``StepResult`` and sends it with the step's ``TokenBatch``; the tokenizer copies it onto
every ``TextDelta`` it releases from that batch, with its own two stamps; the gateway
adds when the delta reached it and when the client's write of it returned, and turns
consecutive deltas of a request into a per-token breakdown (``houchu.api.token_path``).
"""

from __future__ import annotations

from msgspec import Struct


class StepStamps(Struct, array_like=True, kw_only=True):
    """Where one step's tokens were, and when. Every ``*_s`` field is a duration in
    seconds; every other float is wall-clock seconds (``time.time()``); 0.0: not
    stamped.

    Attributes:
        step_id: the step (``StepPlan.step_id``).
        plan_sent: the scheduler handed the step's plan to its outbox.
        plan_received: the runner's loop took the plan.
        step_started: the runner began executing it (``StepResult.started_at``).
        step_s: seconds the execution took (``StepResult.duration_s``): ``forward_s``,
            ``sample_s`` and the runner's own bookkeeping (validation, the batch's
            tensors, the outputs).
        forward_s: of ``step_s``, the model's forward passes (the thread governor's
            wrapper included).
        sample_s: of ``step_s``, sampling and verifying (logits to token ids).
        result_sent: the runner handed the ``StepResult`` to its outbox.
        result_received: the scheduler took it.
        tokens_sent: the scheduler handed the step's ``TokenBatch`` to its outbox (after
            applying the result, before planning the next step).
        tokenizer_received: the tokenizer took the ``TokenBatch``.
        tokenizer_sent: the tokenizer handed this delta to its outbox (the batch's
            detokenization and stop-string checks up to this delta done).
        gateway_received: the gateway's engine client took the delta (set there).
        written: the handler's write of the delta to the client returned (set there).
    """

    step_id: int
    plan_sent: float = 0.0
    plan_received: float = 0.0
    step_started: float = 0.0
    step_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    result_sent: float = 0.0
    result_received: float = 0.0
    tokens_sent: float = 0.0
    tokenizer_received: float = 0.0
    tokenizer_sent: float = 0.0
    gateway_received: float = 0.0
    written: float = 0.0

    @property
    def step_end(self) -> float:
        """Wall-clock seconds when the runner's execution of the step ended."""
        return self.step_started + self.step_s
