"""The ``Failure`` a request ends with: its codes, its constructors, and the exception
that carries it inside one process.

A failure is made once, where the error happens, as a ``transport.messages.Failure``
(status, code, message, maybe the parameter at fault). It crosses the actors unchanged
(``StepResult.error``, ``TokenEvent.failure``, ``RequestFailed.failure``), and inside a
process it travels as a ``Failed`` exception, until the gateway turns it into the HTTP
error body or the WebSocket error frame (``houchu.api.errors``, the only place
that does).
"""

from __future__ import annotations

from houchu.transport.messages import Failure

#: ``Failure.code`` values made by the engine (the gateway's validator adds its own,
#: such as "invalid_value" or "missing_required_parameter").
INVALID_REQUEST = "invalid_request_error"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
OVERLOADED = "server_overloaded"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
INTERNAL = "internal_error"


def bad_request(message: str, *, code: str = INVALID_REQUEST, param: str | None = None) -> Failure:
    """HTTP 400: the request is at fault and will never be served as it is."""
    return Failure(message=message, status=400, code=code, param=param)


def overloaded(message: str) -> Failure:
    """HTTP 429: refused for now (a queue is full); the client should retry later."""
    return Failure(message=message, status=429, code=OVERLOADED)


def internal(message: str) -> Failure:
    """HTTP 500: the engine failed the request (a failed step)."""
    return Failure(message=message, status=500, code=INTERNAL)


def unavailable(message: str, *, code: str = UNAVAILABLE) -> Failure:
    """HTTP 503: an actor is restarting or does not answer; the client should retry."""
    return Failure(message=message, status=503, code=code)


class Failed(Exception):
    """Raised with the ``Failure`` a request ends with; ``str()`` is its message.

    Args:
        failure: what the client is told.
    """

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure

    @property
    def message(self) -> str:
        """The human-readable explanation."""
        return self.failure.message

    @property
    def status(self) -> int:
        """The HTTP status the client gets."""
        return self.failure.status

    @property
    def code(self) -> str | None:
        """The machine-readable code."""
        return self.failure.code

    @property
    def param(self) -> str | None:
        """The request parameter at fault, or None."""
        return self.failure.param
