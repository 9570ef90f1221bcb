"""Structured-output jump-forward: where a request's grammar allows only one
continuation, its tokens are appended without a decode step each.

SGLang's "jump-forward decoding with a compressed finite-state machine" (Zheng et al.,
"SGLang: Efficient Execution of Structured Language Model Programs", 2024, section 4)
and guidance's / llguidance's fast-forward tokens: after the sampled token of a step is
committed, the matcher is asked for the bytes the grammar forces next, as tokens
(``llguidance.LLMatcher.compute_ff_tokens``); those tokens are consumed by the matcher
and returned as ``SeqOutput(forced=True)`` after the step's sampled ones. Their KV is
not computed in that step: the scheduler appends them to the request, which then has
``1 + k`` tokens without KV, and plans them as one multi-token extend chunk (as it plans
a prefill chunk) whose last position samples. One forward pass covers what would have
been ``k + 1`` decode steps; ``k`` steps are saved.

Retokenization at the boundary. Forcing the forced string's naive tokenization can
force a non-canonical tokenization the model never saw (a key ``"orderId"`` forced as
``order`` + ``Id`` where the tokenizer has ``orderId``; a closing quote forced alone
where the canonical text has ``":``). SGLang retokenizes the text around the jump and
rolls back the tokens that changed; llguidance instead forces only a canonical prefix:
it tokenizes the forced bytes and drops the last tokens when some vocabulary token
could span the end of the forced bytes and still match the grammar (llguidance's
``docs/fast_forward.md``). The dropped bytes are then sampled normally, so the output is
the tokenizer's own tokenization of the text (``tests/integration/test_jump_forward.py`` checks
the round trip on the default model's tokenizer).

The overlap scheduler plans a request's next step before it sees the forced tokens: that
step computes the KV of the sampled token (the placeholder), and its position is behind
the request's frontier, so the runner draws nothing there (``drop_stale_samples``) and the
scheduler voids the sample it expected (``StepTracker.void_samples``). The forced tokens
go in the step after.

Beside requests without a grammar, the chunk's forced tokens run in a forward pass of
their own (``houchu.model.grammar.catch_up``): in the free requests' pass they would change the
decode path those rows take, and so their output.

Not used for a request that asks for logprobs (a forced token's log-probability would
need the forward pass that jump-forward skips), nor past its ``max_tokens``.

The ledger (lever ``jump_forward``, verb break_serial): saved = forward passes not run
(one per forced token, less the passes the forced tokens took alone: ``charge``),
spent = seconds computing forced tokens after the sampler (on the step's critical path)
and those passes' seconds; one sample per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from houchu.model.grammar.matcher import RequestGrammar
from houchu.model.sampling.sampler import RequestState
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.messages import Failure, StepPlan
from houchu.transport.telemetry import LeverSample

#: The ledger's name of the lever, and its verb.
JUMP_FORWARD_LEVER, JUMP_FORWARD_VERB = Lever.JUMP_FORWARD, Verb.BREAK_SERIAL


def drop_stale_samples(
    plan: StepPlan, state_of: Callable[[str], RequestState], forced: set[str]
) -> set[str]:
    """Clear ``sample`` on each work item of ``plan`` whose request got forced tokens in
    the previous step (``forced``: rids) and that ends behind that request's frontier
    (the prompt plus every token generated so far, forced ones included): the next token
    there is already known, so nothing is drawn (a step the overlap scheduler planned
    before it saw the forced tokens). Changes ``plan`` itself. Only those requests: a
    draft model's runner rolls a sequence back behind its sampled history and must
    still draw there.

    Args:
        plan: the step's plan (placeholders already resolved).
        state_of: rid -> the request's sampling state.
        forced: the rids that got forced tokens in the previous step.
    Returns:
        The rids whose item was told to draw nothing.
    """
    stale = set()
    for w in plan.work:
        if not w.sample or w.num_draft or w.rid not in forced:
            continue
        st = state_of(w.rid)
        if w.start_pos + len(w.token_ids) < len(st.prompt_ids) + len(st.generated):
            w.sample = False
            stale.add(w.rid)
    return stale


class JumpForward:
    """The runner's jump-forward: forced tokens after each committed step, and the
    ledger.

    Args:
        enabled: ``--jump-forward on``.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tokens = 0  # tokens forced since start
        self.split_passes = 0  # passes of catch-up tokens alone (``charge``) since start
        self.forced_rids: set[str] = set()  # rids forced at the last commit
        #: per request since the last samples(): [tokens forced, seconds spent]
        self._per_request: dict[str, list[float]] = {}

    def commit(
        self,
        grammars: Sequence[RequestGrammar | None],
        states: Sequence[RequestState],
        sampled: Sequence[Sequence[int]],
        failures: dict[str, Failure],
    ) -> list[list[int]]:
        """Commit each constrained request's ``sampled`` tokens to its grammar (a matcher
        that stopped adds the request to ``failures``), then force what the grammar
        allows as its only continuation.

        Args:
            grammars: per sampled request, its grammar or None.
            states: per sampled request, its sampling state (forced tokens are appended).
            sampled: per sampled request, the token ids emitted this step.
            failures: rid -> why the request fails (updated).
        Returns:
            Per request, the forced token ids ([] for most).
        """
        forced: list[list[int]] = []
        self.forced_rids = set()
        for g, st, ss in zip(grammars, states, sampled, strict=True):
            ff: list[int] = []
            if g is not None:
                g.commit(ss)
                failure = g.failure()  # its matcher stopped: the request fails
                if failure is not None:
                    failures[g.rid] = failure
                elif self.enabled and ss:
                    ff = self._force(g, st)
            forced.append(ff)
            if ff:
                self.forced_rids.add(st.rid)
        return forced

    def take_forced_rids(self) -> set[str]:
        """The rids that got forced tokens at the last ``commit``, once (then empty)."""
        rids, self.forced_rids = self.forced_rids, set()
        return rids

    def _force(self, g: RequestGrammar, st: RequestState) -> list[int]:
        """Consume and return ``g``'s forced tokens (appended to ``st``)."""
        m, p = g.matcher, st.params
        room = p.max_tokens - len(st.generated)
        if p.logprobs or room <= 0 or m.is_stopped() or m.is_error():
            return []
        t0 = time.perf_counter()
        ff = list(m.compute_ff_tokens())[:room]
        ff = ff[: m.validate_tokens(ff)] if ff else ff
        if ff:
            m.consume_tokens(ff)
        for t in ff:
            st.append(t)
        g.consumed += len(ff)
        self.tokens += len(ff)
        acc = self._per_request.setdefault(g.rid, [0.0, 0.0])
        acc[0] += len(ff)
        acc[1] += time.perf_counter() - t0
        return ff

    def charge(self, rids: Sequence[str], seconds: float) -> None:
        """A forward pass of the catch-up tokens of ``rids`` alone (``houchu.model.grammar.catch_up``:
        beside free requests), ``seconds`` long: one pass less saved and its seconds
        spent, shared among them."""
        self.split_passes += 1
        for rid in rids:
            acc = self._per_request.setdefault(rid, [0.0, 0.0])
            acc[0] -= 1.0 / len(rids)
            acc[1] += seconds / len(rids)

    def samples(self, now: float | None = None) -> list[LeverSample]:
        """The ledger since the last call: per request that was checked, forward passes
        saved (tokens forced, less the passes its catch-up tokens took alone: ``charge``)
        and the seconds it cost."""
        t = time.time() if now is None else now
        out = [
            LeverSample(
                JUMP_FORWARD_LEVER,
                JUMP_FORWARD_VERB,
                n,
                Unit.FORWARD_PASSES,
                s,
                Unit.SECONDS,
                t,
                rid,
            )
            for rid, (n, s) in self._per_request.items()
        ]
        self._per_request = {}
        return out
