"""Workloads: what the load generator sends, as sessions of requests.

A :class:`Session` is a list of requests sent one after another; single-request
workloads have one request per session. In a multi-turn session each turn resends the
whole conversation so far (earlier questions and the server's answers) plus a new
question. Every workload is a pure function of its :class:`WorkloadConfig` and seed.

- ``random``: independent prompts; input and output lengths drawn from distributions.
- ``shared-prefix``: N system prompts x M questions, shuffled (prefix caching pays here).
- ``multi-turn``: conversations of T turns; the history grows turn by turn.
- ``long-prompt``: short streams with a long prompt arriving every K-th request
  (tagged ``long``; the others ``short``), to see what a long prefill does to the
  inter-token latency of the streams already running.
- ``replay``: a JSONL file, one request a line: ``{"prompt": ...}`` or
  ``{"messages": [...]}`` or ``{"user": ..., "system": ...}``, optionally
  ``"max_tokens"`` and ``"tag"``.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from houchu.bench.dist import LengthDist, parse_dist
from houchu.bench.prompts import PromptBuilder

WORKLOADS = ("random", "shared-prefix", "multi-turn", "long-prompt", "replay")

Message = dict[str, str]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    Attributes:
        user: the question (chat: the user message; completions: the prompt's end).
        system: a system prompt placed before it, or None.
        max_tokens: output tokens asked for.
        tag: a class label for per-class metrics (``short``, ``long``, ``turn``...).
        messages: verbatim chat messages (replay), used instead of system/user.
        prompt: a verbatim completion prompt (replay), used instead of system/user.
    """

    user: str = ""
    system: str | None = None
    max_tokens: int = 128
    tag: str = "request"
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None

    def chat(self, history: list[Message]) -> list[Message]:
        """Chat messages: the system prompt, the conversation so far, the question."""
        if self.messages is not None:
            return [*history, *self.messages]
        head = [{"role": "system", "content": self.system}] if self.system else []
        if self.prompt is not None:
            return [*head, *history, {"role": "user", "content": self.prompt}]
        return [*head, *history, {"role": "user", "content": self.user}]

    def completion(self, history: list[Message]) -> str:
        """A completion prompt: the same content as plain text, blank-line separated."""
        if self.prompt is not None and not history:
            return self.prompt
        return "\n\n".join(m["content"] for m in self.chat(history))


@dataclass
class Session:
    """Requests sent in order; ``multi_turn`` carries the history from turn to turn."""

    turns: list[RequestSpec]
    multi_turn: bool = False


@dataclass
class WorkloadConfig:
    """Parameters of a workload (lengths in tokens).

    Attributes:
        kind: one of :data:`WORKLOADS`.
        num_requests: requests in total (turns count one each).
        input_len: question length.
        output_len: output tokens asked for.
        num_prefixes: shared-prefix: distinct system prompts.
        prefix_len: shared-prefix: system prompt length.
        turns: multi-turn: turns per conversation.
        long_len: long-prompt: length of the long prompts.
        long_every: long-prompt: every K-th request is long.
        long_output: long-prompt: output tokens of a long request.
        replay_path: replay: the JSONL file.
    """

    kind: str = "random"
    num_requests: int = 32
    input_len: LengthDist = field(default_factory=lambda: parse_dist("128"))
    output_len: LengthDist = field(default_factory=lambda: parse_dist("128"))
    num_prefixes: int = 4
    prefix_len: int = 512
    turns: int = 4
    long_len: int = 1024
    long_every: int = 8
    long_output: int = 16
    replay_path: str | None = None

    def settings(self) -> dict[str, Any]:
        """The parameters that shape this workload, as JSON-ready values."""
        out: dict[str, Any] = {
            "workload": self.kind,
            "num_requests": self.num_requests,
            "input_len": str(self.input_len),
            "output_len": str(self.output_len),
        }
        extra = {
            "shared-prefix": {"num_prefixes": self.num_prefixes, "prefix_len": self.prefix_len},
            "multi-turn": {"turns": self.turns},
            "long-prompt": {
                "long_len": self.long_len,
                "long_every": self.long_every,
                "long_output": self.long_output,
            },
            "replay": {"replay_path": self.replay_path},
        }
        out.update(extra.get(self.kind, {}))
        return out


def build_sessions(cfg: WorkloadConfig, builder: PromptBuilder, seed: int) -> list[Session]:
    """The workload's sessions, holding ``cfg.num_requests`` requests in all.

    Raises:
        ValueError: an unknown kind, bad parameters, or an unreadable replay file.
    """
    if cfg.num_requests < 1:
        raise ValueError("num_requests must be at least 1")
    rng = random.Random(seed)
    makers = {
        "random": _random,
        "shared-prefix": _shared_prefix,
        "multi-turn": _multi_turn,
        "long-prompt": _long_prompt,
        "replay": _replay,
    }
    if cfg.kind not in makers:
        raise ValueError(f"unknown workload {cfg.kind!r}; expected one of {', '.join(WORKLOADS)}")
    return makers[cfg.kind](cfg, builder, rng)


def _random(cfg: WorkloadConfig, b: PromptBuilder, rng: random.Random) -> list[Session]:
    return [
        Session(
            [
                RequestSpec(
                    b.text(rng, cfg.input_len.sample(rng)),
                    None,
                    cfg.output_len.sample(rng),
                    "random",
                )
            ]
        )
        for _ in range(cfg.num_requests)
    ]


def _shared_prefix(cfg: WorkloadConfig, b: PromptBuilder, rng: random.Random) -> list[Session]:
    if cfg.num_prefixes < 1 or cfg.prefix_len < 1:
        raise ValueError("shared-prefix needs num_prefixes >= 1 and prefix_len >= 1")
    systems = [b.text(rng, cfg.prefix_len) for _ in range(cfg.num_prefixes)]
    per = math.ceil(cfg.num_requests / cfg.num_prefixes)
    specs = [
        RequestSpec(
            b.text(rng, cfg.input_len.sample(rng)), s, cfg.output_len.sample(rng), f"prefix{i}"
        )
        for i, s in enumerate(systems)
        for _ in range(per)
    ]
    rng.shuffle(specs)
    return [Session([s]) for s in specs[: cfg.num_requests]]


def _multi_turn(cfg: WorkloadConfig, b: PromptBuilder, rng: random.Random) -> list[Session]:
    if cfg.turns < 1:
        raise ValueError("multi-turn needs turns >= 1")
    sessions: list[Session] = []
    left = cfg.num_requests
    while left > 0:
        n = min(cfg.turns, left)
        turns = [
            RequestSpec(
                b.text(rng, cfg.input_len.sample(rng)), None, cfg.output_len.sample(rng), f"turn{t}"
            )
            for t in range(n)
        ]
        sessions.append(Session(turns, multi_turn=True))
        left -= n
    return sessions


def _long_prompt(cfg: WorkloadConfig, b: PromptBuilder, rng: random.Random) -> list[Session]:
    if cfg.long_every < 1 or cfg.long_len < 1 or cfg.long_output < 1:
        raise ValueError("long-prompt needs long_every, long_len and long_output >= 1")
    out = []
    for i in range(cfg.num_requests):
        if i % cfg.long_every == cfg.long_every - 1:
            spec = RequestSpec(b.text(rng, cfg.long_len), None, cfg.long_output, "long")
        else:
            spec = RequestSpec(
                b.text(rng, cfg.input_len.sample(rng)), None, cfg.output_len.sample(rng), "short"
            )
        out.append(Session([spec]))
    return out


def _replay(cfg: WorkloadConfig, b: PromptBuilder, rng: random.Random) -> list[Session]:
    if not cfg.replay_path:
        raise ValueError("replay needs a JSONL file (--replay PATH)")
    out: list[Session] = []
    with Path(cfg.replay_path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if len(out) >= cfg.num_requests:
                break
            if not line.strip():
                continue
            try:
                out.append(Session([_replay_spec(json.loads(line), cfg, rng)]))
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"{cfg.replay_path}:{lineno}: {exc}") from exc
    if not out:
        raise ValueError(f"{cfg.replay_path} holds no requests")
    return out


def _replay_spec(row: Any, cfg: WorkloadConfig, rng: random.Random) -> RequestSpec:
    if not isinstance(row, dict):
        raise ValueError("each line must be a JSON object")
    max_tokens = int(row.get("max_tokens", row.get("output_len", 0)) or cfg.output_len.sample(rng))
    tag = str(row.get("tag", "replay"))
    if "messages" in row:
        msgs = tuple(
            {"role": str(m["role"]), "content": str(m["content"])} for m in row["messages"]
        )
        return RequestSpec(max_tokens=max_tokens, tag=tag, messages=msgs)
    if "prompt" in row:
        return RequestSpec(max_tokens=max_tokens, tag=tag, prompt=str(row["prompt"]))
    if "user" in row:
        system = row.get("system")
        return RequestSpec(str(row["user"]), str(system) if system else None, max_tokens, tag)
    raise ValueError("a line needs 'prompt', 'messages' or 'user'")
