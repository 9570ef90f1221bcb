"""Structured output in the runner: a grammar matcher per constrained request, its token
mask computed beside the forward pass, applied in the sampler.

The grammar engine is llguidance (Microsoft's guidance project; Earley parser over a
lexer, token masks from a token trie: https://github.com/guidance-ai/llguidance). Each
constrained request (``SamplingParams.structured``) gets an ``llguidance.LLMatcher`` at
``SeqInit``, built on the model's tokenizer (loaded once, on first use or by
``GrammarEngine.warm``).

Per step (``GrammarEngine.start`` / ``MaskJob.wait``), as vLLM and SGLang do it:

1. before the forward pass, one worker thread fills each constrained row's bitmask
   (``[rows, ceil(V / 32)]`` int32, bit ``t % 32`` of word ``t // 32`` set when token
   ``t`` is allowed) while the model runs, and unpacks the constrained rows into
   ``[Rc, V]`` bool (``bitmask_to_allowed``); llguidance drops the GIL while it computes;
2. after the forward pass the sampler waits for the masks (the wait is the mask time
   the forward pass did not hide) and sets disallowed logits to -inf in one pass over
   the constrained rows (``Sampler.sample(masks=...)``, ``apply_grammar_masks``);
3. the emitted tokens are consumed by each matcher (``RequestGrammar.commit``).

Speculative decoding: a verified request's rows are the distributions after each
proposal. The worker consumes the proposals the grammar accepts (``validate_tokens``),
one mask per row, then rolls the matcher back (proposals after the one that completes
the grammar, EOS, are not consumed: ``RequestGrammar.fill``); a proposal the grammar
rejects cannot be accepted (its row's mask excludes it), so rows after it are never
sampled. Only the emitted tokens are committed.

A matcher that has finished allows only the end-of-sequence tokens, so the request
ends. A matcher that enters an error state (llguidance hit one of its limits on this
grammar: an Earley row above ``max_items_in_row``, a lexer that builds too many states,
"too many expressions constructed"; limits it cannot check when compiling, since it
builds its lexer lazily), or whose grammar matches no text at all, fails its request:
``RequestGrammar.failure`` gives the 400 (``houchu.model.grammar.errors``) the runner
reports in ``StepResult.failures`` (that row's mask allows only EOS until the scheduler
drops the request; the other rows go on).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from houchu.model.grammar.errors import first_line, matcher_failure
from houchu.model.grammar.fill import MaskRow, SoloTiming, constrained_rows, fill_rows
from houchu.model.grammar.tokenizer import GrammarTokenizer, TokenizerUnavailable
from houchu.transport.failures import bad_request, internal
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.messages import Failure
from houchu.transport.structured import StructuredOutput
from houchu.transport.telemetry import LeverSample

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger(__name__)

_BITS = torch.arange(32, dtype=torch.int32)  # [32]
#: the ledger's lever of grammar masks made beside the forward pass, and its unit
_MASK, _S = Lever.STRUCTURED_OUTPUT_MASK, Unit.SECONDS


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def bitmask_to_allowed(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack llguidance bitmasks.

    One pass of numpy's ``unpackbits`` over the words' bytes (little-endian: token ``t``
    is bit ``t % 8`` of byte ``t // 8``), a few times faster than shifting each word by
    0..31 in torch; big-endian hosts take the shifts.

    Args:
        bitmask: ``[R, ceil(V / 32)]`` int32 on the CPU, bit ``t % 32`` of word ``t // 32``
            set when token ``t`` is allowed.
        vocab_size: V.
    Returns:
        ``[R, V]`` bool, True where allowed (a view of a fresh ``[R, 32 W]`` array).
    """
    r = bitmask.shape[0]
    if sys.byteorder == "little":
        words = bitmask.contiguous().numpy().view(np.uint8)  # [R, 4 W] uint8
        bits = np.unpackbits(words, axis=1, bitorder="little")  # [R, 32 W] uint8 0/1
        return torch.from_numpy(bits.view(np.bool_))[:, :vocab_size]
    bits = (bitmask[:, :, None] >> _BITS) & 1  # [R, W, 32] int32
    return bits.bool().reshape(r, -1)[:, :vocab_size]


class RequestGrammar:
    """One request's matcher.

    Args:
        matcher: an ``llguidance.LLMatcher`` at the start of the output.
        eos_ids: the tokens that end a request (allowed when the grammar is done).
        kind: the grammar's form (``StructuredOutput.kind``).
        rid: the request's id (its share of the mask time is counted under it).
        param: the request field the grammar came from (``StructuredOutput.param``).
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        eos_ids: Sequence[int],
        kind: str,
        rid: str = "",
        param: str = "",
    ) -> None:
        self.matcher, self.eos_ids, self.kind, self.rid = matcher, list(eos_ids), kind, rid
        self.param = param
        self.consumed = 0  # output tokens the matcher has taken
        self.reported = False  # its failure was given once (``failure``)
        self.solo = SoloTiming()  # its masks timed alone (its share of a batched fill)

    def failure(self) -> Failure | None:
        """The 400 the request ends with, once, when its matcher entered an error state
        (llguidance hit one of its limits on this grammar); else None."""
        if self.reported or not self.matcher.is_error():
            return None
        self.reported = True
        return matcher_failure(self.matcher.get_error(), self.consumed, self.param)

    def fill(self, bitmask: torch.Tensor, row: int, drafts: Sequence[int]) -> None:
        """Write the masks of rows ``row .. row + m`` of ``bitmask`` (``[R, W]`` int32,
        contiguous): the next token now, then after each of the first ``m`` proposals
        the grammar accepts; the matcher is rolled back to where it was.

        Once a proposal completes the grammar (the matcher stops), the proposals after
        it are the end-of-sequence token and are not consumed: their rows allow only
        EOS. llguidance takes EOS at a stop without recording it, so a rollback
        counting it would undo one real token too many (the next commit then fails on
        a token the mask allowed: a false "too complex" 400).
        """
        m = self.matcher
        self._fill_row(bitmask, row)
        valid = m.validate_tokens(list(drafts)) if drafts and not m.is_stopped() else 0
        taken = 0  # proposals the matcher recorded (what the rollback undoes)
        for j in range(valid):
            if m.is_stopped():
                self.eos_only(bitmask[row + j + 1])
                continue
            m.consume_token(drafts[j])
            taken += 1
            self._fill_row(bitmask, row + j + 1)
        if taken:
            m.rollback(taken)

    def _fill_row(self, bitmask: torch.Tensor, row: int) -> None:
        m = self.matcher
        v = bitmask[row]
        if m.is_error():
            self.eos_only(v)
            return
        m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())
        if m.is_stopped():
            self.eos_only(v)

    def eos_only(self, v: torch.Tensor) -> None:
        """Row ``v`` (``[W]`` int32) allowing only the end-of-sequence tokens."""
        v.zero_()
        b = v.view(torch.uint8)  # little-endian words: token t is bit t % 8 of byte t // 8
        for t in self.eos_ids:
            if 0 <= t < b.numel() * 8:
                b[t // 8] |= 1 << (t % 8)

    def commit(self, tokens: Sequence[int]) -> None:
        """Consume the tokens emitted for this request this step."""
        m = self.matcher
        for t in tokens:
            if m.is_stopped():
                return  # done: only EOS could follow
            if not m.consume_token(t):
                log.info(
                    "request %s: grammar matcher stopped at token %d: %s",
                    self.rid,
                    t,
                    first_line(m.get_error()),
                )
                return
            self.consumed += 1


class MaskJob:
    """The masks of one step, computed on the engine's worker thread."""

    def __init__(
        self,
        engine: GrammarEngine,
        future: Future[tuple[torch.Tensor, float]],
        bitmask: torch.Tensor,
        rows: list[MaskRow],
    ) -> None:
        self.engine, self.future, self.bitmask, self.rows = engine, future, bitmask, rows
        self.started = time.perf_counter()
        #: the logits rows under a grammar, ascending (the rows of the unpacked masks)
        self.constrained = constrained_rows(rows)

    def wait(self, vocab_size: int, device: torch.device) -> list[torch.Tensor | None]:
        """Each logits row's mask (``[V]`` bool on ``device``), None for free rows; counts
        the wait in the ledger. The worker unpacked the masks too, so only their move
        to ``device`` is left to do here."""
        t0 = time.perf_counter()
        allowed, finished = self.future.result()  # [Rc, V] bool on the CPU, perf_counter
        waited = time.perf_counter() - t0
        # the worker's time from the submission to its last mask: what the step would
        # have spent on masks; the part of it the sampler did not wait for was hidden
        self.engine.count(finished - self.started, waited, self.rows)
        masks: list[torch.Tensor | None] = [None] * self.bitmask.shape[0]
        if self.constrained:
            allowed = allowed[:, :vocab_size].to(device)  # [Rc, V]
            for k, i in enumerate(self.constrained):
                masks[i] = allowed[k]
        return masks


class GrammarEngine:
    """The runner's structured output: matchers, the mask worker, the ledger.

    Args:
        model_path: the model (for its tokenizer).
        vocab_size: V, the rows of the model's logits.
    """

    def __init__(self, model_path: str | Path, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = GrammarTokenizer(model_path, vocab_size)
        self._worker: ThreadPoolExecutor | None = None
        self._executor: llguidance.LLExecutor | None = None  # batched masks
        self.mask_s = 0.0  # mask wall seconds since the last samples()
        self.waited_s = 0.0  # seconds the sampler waited for masks
        self.steps = 0
        self.fills = 0  # steps whose masks were started (``grammar_fill.SOLO_EVERY``)
        #: per request since the last samples(): [hidden seconds, waited seconds]
        self._per_request: dict[str, list[float]] = {}

    def warm(self) -> None:
        """Start loading the tokenizer now (a server calls it at start-up)."""
        self.tokenizer.warm()

    def compile(self, rid: str, spec: StructuredOutput) -> RequestGrammar:
        """A matcher for ``spec``.

        Raises:
            ValueError: no tokenizer, or a grammar llguidance cannot compile.
        """
        import llguidance

        tok = self.tokenizer.get()
        limits = llguidance.LLParserLimits(verbose_errors=False)  # no parser dumps
        matcher = llguidance.LLMatcher(tok, spec.grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise ValueError(
                f"request {rid!r}: grammar does not compile: {first_line(matcher.get_error())}"
            )
        return RequestGrammar(matcher, tok.eos_tokens, spec.kind, rid, spec.param)

    def compile_failure(self, spec: StructuredOutput, exc: ValueError) -> Failure:
        """The 400 of a request whose grammar ``compile`` refused (``exc``): the
        gateway's check passed, the runner's compile on the model's tokenizer did not."""
        if isinstance(exc, TokenizerUnavailable):  # the server's fault, not the request's
            return internal(str(exc))
        where = f"'{spec.param}'" if spec.param else "the structured output constraint"
        return bad_request(
            f"{where} cannot be compiled for this model's tokenizer: {exc}",
            code="invalid_grammar",
            param=spec.param or None,
        )

    def start(
        self,
        grammars: Sequence[RequestGrammar | None],
        counts: Sequence[int],
        drafts: Sequence[Sequence[int]],
    ) -> MaskJob | None:
        """Start filling the masks of a step's sampled requests (None when none is
        constrained); call before the forward pass.

        Args:
            grammars: per sampled request, its grammar or None.
            counts: logits rows per request (``len(drafts[i]) + 1``).
            drafts: per request, the proposals to verify.
        """
        rows, row = [], 0
        for g, c, d in zip(grammars, counts, drafts, strict=True):
            if g is not None:
                rows.append(MaskRow(g, row, d))
            row += c
        if not rows:
            return None
        bitmask = torch.full((row, bitmask_words(self.vocab_size)), -1, dtype=torch.int32)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="houchu-grammar")
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        future = self._worker.submit(
            _fill_all, rows, bitmask, self.vocab_size, self._executor, self.fills
        )
        self.fills += 1
        return MaskJob(self, future, bitmask, rows)

    def count(self, mask_wall_s: float, waited_s: float, rows: Sequence[MaskRow] = ()) -> None:
        """Record one step's mask time: its wall time and the part not hidden, shared
        among the step's constrained requests (``rows``) in proportion to the worker
        time each one's masks took (``MaskRow.fill_s``: measured for a row filled
        alone, estimated from the request's masks timed alone for a batched one,
        ``houchu.model.grammar.fill``; equal shares when none was measurable)."""
        self.mask_s += mask_wall_s
        self.waited_s += waited_s
        self.steps += 1
        total = sum(r.fill_s for r in rows)
        hidden = max(0.0, mask_wall_s - waited_s)
        for r in rows:
            share = r.fill_s / total if total > 0 else 1.0 / len(rows)
            acc = self._per_request.setdefault(r.grammar.rid, [0.0, 0.0])
            acc[0] += hidden * share
            acc[1] += waited_s * share

    def samples(self, now: float | None = None) -> list[LeverSample]:
        """The ledger since the last call: mask seconds hidden behind the forward pass
        (saved) and seconds the sampler waited for masks (spent), fill verb; one sample
        per constrained request (its ``rid`` set, its share of each step), so a
        request's own mask time is its samples' saved + spent."""
        if not self.steps:
            return []
        t = time.time() if now is None else now
        out = [
            LeverSample(_MASK, Verb.FILL, hidden, _S, waited, _S, t, rid or None)
            for rid, (hidden, waited) in self._per_request.items()
        ]
        if not out:  # steps counted without their rows: one engine-wide sample
            hidden = max(0.0, self.mask_s - self.waited_s)
            out = [LeverSample(_MASK, Verb.FILL, hidden, _S, self.waited_s, _S, t)]
        self.mask_s = self.waited_s = 0.0
        self.steps = 0
        self._per_request = {}
        return out


def _fill_all(
    rows: list[MaskRow], bitmask: torch.Tensor, vocab_size: int, executor: Any = None, step: int = 0
) -> tuple[torch.Tensor, float]:
    """The worker's job: fill ``bitmask``'s constrained rows (``grammar_fill.fill_rows``:
    the rows without proposals in one ``LLExecutor`` call, the rest row by row), then
    unpack them (``[Rc, V]`` bool, rows ``constrained_rows(rows)``), all while the
    forward pass runs. Returns them and the ``perf_counter`` at the end."""
    with torch.inference_mode():  # the runner made ``bitmask`` in inference mode
        fill_rows(rows, bitmask, executor, step)
        idx = constrained_rows(rows)
        packed = bitmask if len(idx) == bitmask.shape[0] else bitmask[torch.tensor(idx)]
        return bitmask_to_allowed(packed, vocab_size), time.perf_counter()  # [Rc, V]
