"""``RunnerOptions`` for tests that build a ``ModelRunner`` themselves."""

from __future__ import annotations

from houchu.options.runner_options import RunnerOptions


def exact(**kw: object) -> RunnerOptions:
    """The exact, eager CPU path (what ``ModelRunner`` did before it took options): no
    quantization, no compiled step, fixed decode paths, on the CPU. ``kw`` overrides any
    field (``houchu serve``'s defaults are ``RunnerOptions()``'s: auto everything)."""
    fixed = {"device": "cpu", "quantization": "none", "compile": "off", "decode_paths": "rules"}
    return RunnerOptions(**{**fixed, **kw})
