"""The lifecycle and supervision messages between every actor and the launcher
(``houchu.actors.supervisor``). Re-exported by ``houchu.transport.messages``."""

from __future__ import annotations

from msgspec import Struct

# ---------------------------------------------------------------- lifecycle


class ActorReady(Struct, tag=True, kw_only=True):
    """An actor finished starting; ``info`` is a short human-readable summary."""

    name: str
    pid: int
    info: str = ""


class ActorFailed(Struct, tag=True, kw_only=True):
    """An actor could not start or crashed; ``error`` explains why."""

    name: str
    error: str


class Shutdown(Struct, tag=True):
    """Ask an actor to stop its loop and exit."""

    reason: str = ""


# ---------------------------------------------------------------- supervision


class Heartbeat(Struct, tag=True, kw_only=True):
    """An actor's event loop is alive (sent to the launcher about once a second).

    ``busy_s``: seconds the actor's current blocking unit of work (a model step) has run
    so far, 0 when idle; the launcher treats a long ``busy_s`` like a missing heartbeat.
    """

    name: str
    pid: int
    busy_s: float = 0.0


class ActorStuck(Struct, tag=True, kw_only=True):
    """A peer waited too long on actor ``name`` (e.g. the scheduler on a step result);
    the launcher restarts that actor. ``reason`` says who waited on what."""

    name: str
    reason: str


class ActorDown(Struct, tag=True, kw_only=True):
    """The launcher to every other actor: ``name`` died; ``generation`` is the number of
    its replacement (0 was the first process). Receivers drop what they hold for it,
    fail or abort the requests it was handling, and reconnect their outbox to it, so
    that nothing meant for the dead process reaches its replacement."""

    name: str
    generation: int


class ActorUp(Struct, tag=True, kw_only=True):
    """The launcher to every other actor: generation ``generation`` of ``name`` is ready."""

    name: str
    generation: int
