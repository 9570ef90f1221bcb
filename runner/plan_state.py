"""What ``ModelRunner.execute`` checks and resolves in a step plan before it runs:
the state each work item's request has, the overlap scheduler's placeholder tokens, and
the grammars of the requests the plan registers; and what it makes of the sampled
tokens (the grammars' commits, the ``SeqOutput``s)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from houchu.model.grammar.matcher import GrammarEngine, RequestGrammar
from houchu.model.sampling.sampler import RequestState, Sample
from houchu.transport.messages import Failure, SeqInit, SeqOutput, StepPlan


def prompt_chunk_rids(plan: StepPlan, state_of: Callable[[str], RequestState]) -> set[str]:
    """The requests whose work in ``plan`` computes prompt tokens only (a prefill chunk,
    or the uncached tail of a cached prompt, however short): they attend on the prefill
    kernel (``StepBatch.prompt_seqs``), so that a prompt's last logits and KV are the
    same bits whether its first pages were cached or not. Decode tokens, proposals to
    verify and jump-forward chunks (tokens past the prompt) keep the decode kernels."""
    return {
        w.rid
        for w in plan.work
        if not w.use_last_sampled
        and not w.num_draft
        and w.start_pos + len(w.token_ids) <= len(state_of(w.rid).prompt_ids)
    }


def live_state(
    rid: str, states: dict[str, RequestState], new: dict[str, RequestState]
) -> RequestState:
    """The state of ``rid``, registered before or by this plan.

    Raises:
        ValueError: ``rid`` was never initialised (or was released).
    """
    state = new.get(rid) or states.get(rid)
    if state is None:
        raise ValueError(f"request {rid!r} was never initialised (or released)")
    return state


def new_states(
    plan: StepPlan, states: dict[str, RequestState], vocab_size: int, device: torch.device
) -> dict[str, RequestState]:
    """The sampling states of the requests ``plan`` registers (``states``: those
    registered before; ``vocab_size`` and ``device``: the model's).

    Raises:
        ValueError: a rid registered twice or still registered (not released by
            ``plan``), or a work item of a request neither registered nor new.
    """
    live = set(states) - set(plan.release)
    new: dict[str, RequestState] = {}
    for si in plan.init:
        if si.rid in live or si.rid in new:
            raise ValueError(f"request {si.rid!r} is already registered")
        new[si.rid] = RequestState(
            si.rid, si.sampling, si.prompt_ids, vocab_size, device, stop_ids=si.stop_ids
        )
    for w in plan.work:
        if w.rid not in live and w.rid not in new:
            raise ValueError(f"request {w.rid!r} was never initialised (or released)")
    return new


def resolve_last_sampled(plan: StepPlan, previous: dict[str, int]) -> None:
    """Put the previous step's sampled token (``previous``: rid -> token id) in place of
    each ``use_last_sampled`` work item's placeholder, in ``plan`` itself.

    Raises:
        ValueError: a placeholder whose rid sampled nothing in the previous step, or a
            placeholder item without tokens. ``plan`` is unchanged then.
    """
    resolved = []
    for w in plan.work:
        if not w.use_last_sampled:
            continue
        if not w.token_ids:
            raise ValueError(f"request {w.rid!r}: a placeholder work item has no tokens")
        token = previous.get(w.rid)
        if token is None:
            raise ValueError(
                f"request {w.rid!r}: placeholder for the last sampled token, but the "
                "previous step sampled nothing for it"
            )
        resolved.append((w, token))
    for w, token in resolved:
        w.token_ids = [token, *w.token_ids[1:]]
        w.use_last_sampled = False


def compile_grammars(
    engine: GrammarEngine, init: list[SeqInit]
) -> tuple[dict[str, RequestGrammar], dict[str, Failure]]:
    """The matchers of the new constrained requests, and the failures of those whose
    grammar does not compile on the model's tokenizer (such a request fails alone:
    its rows this step are sampled unconstrained and discarded by the scheduler)."""
    grammars: dict[str, RequestGrammar] = {}
    failures: dict[str, Failure] = {}
    for si in init:
        spec = si.sampling.structured
        if spec is None:
            continue
        try:
            grammars[si.rid] = engine.compile(si.rid, spec)
        except ValueError as exc:
            failures[si.rid] = engine.compile_failure(spec, exc)
    return grammars, failures


def seq_outputs(
    states: list[RequestState], samples: list[list[Sample]], forced: list[list[int]]
) -> list[SeqOutput]:
    """One ``SeqOutput`` per emitted token, request after request (``samples`` and
    ``forced`` parallel to ``states``): its sampled tokens, then the tokens its grammar
    forced (jump-forward: ``forced=True``, no logprob)."""
    outputs: list[SeqOutput] = []
    for st, ss, ff in zip(states, samples, forced, strict=True):
        outputs.extend(
            SeqOutput(
                rid=st.rid, token_id=s.token_id, logprob=s.logprob, top_logprobs=s.top_logprobs
            )
            for s in ss
        )
        outputs.extend(SeqOutput(rid=st.rid, token_id=t, forced=True) for t in ff)
    return outputs
