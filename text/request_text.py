"""One request's output text: incremental detokenization, stop strings, logprobs, usage.

The tokenizer actor keeps one ``RequestText`` per running request and feeds it the token
events the scheduler sends; it returns the ``TextDelta`` to forward to the gateway.
"""

from __future__ import annotations

from houchu.text.detokenizer import IncrementalDetokenizer
from houchu.text.stop import StopStringMatcher
from houchu.text.tokenizer.core import TextTokenizer
from houchu.transport.messages import (
    PromptTokenLogprob,
    SamplingParams,
    TextDelta,
    TokenEvent,
    TokenLogprob,
)


class RequestText:
    """Turns a request's generated token ids into the text the client sees.

    Args:
        rid: request id.
        tokenizer: the model's tokenizer.
        prompt_ids: list[int] (prompt_len,), gives the detokenizer its left context.
        sampling: the request's stop strings and logprob settings.
        stop_ids: the ids that end the request (``houchu.text.stop.stop_ids``); their
            text is never emitted when they end it.
        prompt_text: the prompt as text, sent with the first delta when
            ``sampling.echo`` (None: decoded from ``prompt_ids``).

    ``completion_tokens`` counts every token the model generated for the request up to
    and including the one that finished it (an EOS or stop token included). An event may
    carry several tokens (speculative decoding accepts runs); they are taken one at a
    time, so a stop string ends the output — text, ids, logprobs and the count — at the
    token that completed it, exactly as with one token per event.
    """

    def __init__(
        self,
        rid: str,
        tokenizer: TextTokenizer,
        prompt_ids: list[int],
        sampling: SamplingParams,
        stop_ids: list[int],
        prompt_text: str | None = None,
    ) -> None:
        self.rid = rid
        self.prompt_ids = prompt_ids
        self.echo_text: str | None = None
        if sampling.echo:
            self.echo_text = (
                prompt_text if prompt_text is not None else tokenizer.decode(prompt_ids)
            )
        self.want_prompt_logprobs = sampling.prompt_logprobs is not None
        self._prompt_pending = sampling.echo or self.want_prompt_logprobs
        self.tokenizer = tokenizer
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stops = (
            StopStringMatcher(sampling.stop, sampling.include_stop_str_in_output)
            if sampling.stop
            else None
        )
        # ids that end the request without text; with include_stop_str_in_output the
        # request's own stop_token_ids keep their text (as vLLM's stop checker does)
        shown = set(sampling.stop_token_ids) if sampling.include_stop_str_in_output else set()
        self.hidden_ids = frozenset(stop_ids) - shown
        self.stop_token_ids = frozenset(sampling.stop_token_ids)  # the client's own
        self.want_logprobs = sampling.logprobs
        self.min_tokens = sampling.min_tokens  # stop strings are not matched before
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finished = False
        self._unsent_ids: list[int] = []  # ids whose delta was held back (no text yet)

    def on_event(self, ev: TokenEvent) -> TextDelta | None:
        """Consume one event; returns the delta to send, or None if nothing is new.

        After a delta with ``finish_reason`` set (``self.finished``), the request is over:
        a stop string finishing it must also be reported to the scheduler by the caller
        (``FinishRequest``).
        """
        if ev.cached_tokens:
            self.cached_tokens = ev.cached_tokens
        final = ev.finish_reason
        ids = list(ev.token_ids)
        if final == "stop" and ids and ids[-1] in self.hidden_ids:
            ids = ids[:-1]  # the EOS / stop token ends the text; it is not part of it
        text, taken, stopped = self._take(ids)
        if stopped:
            final = "stop"
            self.completion_tokens += taken
        else:
            self.completion_tokens += len(ev.token_ids)
            if final is not None:
                text += self._flush()
                if self.stops is not None and self.stops.stopped:
                    final = "stop"  # the last text completed a stop string (as vLLM's)
        logprobs = self._logprobs(ids[:taken], ev) if self.want_logprobs else None
        prompt_text, prompt_lps = self._prompt(ev)
        if final is not None:
            self.finished = True
        elif not text and not logprobs and not self._prompt_pending:
            return None
        self._prompt_pending = False
        sent_ids, self._unsent_ids = self._unsent_ids, []
        return TextDelta(
            prompt_text=prompt_text,
            prompt_logprobs=prompt_lps,
            rid=self.rid,
            text=text,
            token_ids=sent_ids,
            logprobs=logprobs,
            finish_reason=final,
            stop_reason=self._stop_reason(ev) if final == "stop" else None,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )

    def _stop_reason(self, ev: TokenEvent) -> int | str | None:
        """vLLM's ``stop_reason`` of an output that ended with ``finish_reason: "stop"``
        (``ev``: the last event): the stop string that ended it, else the token id of
        the request's ``stop_token_ids`` that did, else None (an end-of-sequence token,
        or the grammar's end). An EOS id the client also lists in ``stop_token_ids`` is
        reported as that id (vLLM reports its primary EOS id as None)."""
        if self.stops is not None and self.stops.matched is not None:
            return self.stops.matched
        last = ev.token_ids[-1] if ev.token_ids else None
        if ev.finish_reason == "stop" and last in self.stop_token_ids:
            return last
        return None

    def _take(self, ids: list[int]) -> tuple[str, int, bool]:
        """Detokenize ``ids`` one by one through the stop strings: (text released, tokens
        taken, whether a stop string matched — then at the last token taken)."""
        text, stopped = "", False
        for i, tid in enumerate(ids):
            self._unsent_ids.append(tid)
            piece = self.detok.add([tid])
            if self.stops is not None and self.completion_tokens + i + 1 > self.min_tokens:
                piece, stopped = self.stops.feed(piece)
            text += piece
            if stopped:
                return text, i + 1, True
        return text, len(ids), False

    def _flush(self) -> str:
        """End of stream: held characters, through the stop strings."""
        tail = self.detok.flush()
        if self.stops is None:
            return tail
        tail, stopped = self.stops.feed(tail)
        return tail if stopped else tail + self.stops.flush()

    def _prompt(self, ev: TokenEvent) -> tuple[str | None, list[PromptTokenLogprob] | None]:
        """(prompt text, prompt tokens' logprobs) for the first delta, else (None, None)."""
        if not self._prompt_pending:
            return None, None
        lps = None
        if self.want_prompt_logprobs:
            tok, plp = self.tokenizer, ev.prompt_logprobs
            lps = []
            for pos, tid in enumerate(self.prompt_ids):
                j = pos - plp.start if plp is not None else -1
                scored = plp if plp is not None and 0 <= j < len(plp.logprobs) else None
                lps.append(
                    PromptTokenLogprob(
                        token=tok.token_text(tid),
                        token_id=tid,
                        logprob=scored.logprobs[j] if scored is not None else None,
                        rank=scored.ranks[j] if scored is not None else None,
                        bytes_=list(tok.token_bytes(tid)),
                        top=[(tok.token_text(t), t, lp) for t, lp in scored.top[j]]
                        if scored is not None
                        else [],
                    )
                )
        return self.echo_text, lps

    def _logprobs(self, ids: list[int], ev: TokenEvent) -> list[TokenLogprob] | None:
        if not ev.logprobs:
            return None
        tok = self.tokenizer
        out = []
        for i, tid in enumerate(ids):
            top = ev.top_logprobs[i] if ev.top_logprobs else []
            out.append(
                TokenLogprob(
                    token=tok.token_text(tid),
                    token_id=tid,
                    logprob=ev.logprobs[i],
                    bytes_=list(tok.token_bytes(tid)),
                    top=[(tok.token_text(t), t, lp) for t, lp in top],
                )
            )
        return out
