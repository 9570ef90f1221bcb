"""``houchu serve``'s argument parser, built from the flag table, and the configuration
built from its parsed arguments.

Each flag's type, choices and default come from the field it sets
(``houchu.options.flags``): a ``bool`` that defaults to False is a switch, a ``Literal``
gives the choices, ``tuple[int, ...]`` is a comma-separated list, a ``float`` is a finite number,
``X | None`` takes an ``X``. A field's bounds (``Annotated[int, Meta(ge=1)]``) are checked
when the parsed values are converted to the structs (``houchu.options.bounds``).
"""

from __future__ import annotations

import argparse
import math
import os
import types
import typing
from typing import Any, Literal

import msgspec

from houchu.options.flags import GROUPS, Flag, Group
from houchu.options.serve_config import ServeConfig


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with "(default: X)" where an option has a default worth showing
    (not None, not a switch's False, not already in the text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if d in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def batch_sizes(text: str) -> tuple[int, ...]:
    """ "1,2,4" as ascending distinct ints (their bounds are the field's).

    Raises:
        argparse.ArgumentTypeError: not a list of integers.
    """
    try:
        return tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None


def finite_float(text: str) -> float:
    """A float flag's value: a finite number.

    Raises:
        argparse.ArgumentTypeError: not a number, or nan / inf.
    """
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def _without_none(tp: Any) -> Any:
    """``X`` of ``X | None`` and of ``Annotated[X, Meta(...)]`` (``tp`` itself otherwise)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Annotated:
        tp = tp.__origin__
    return tp


def _default(info: msgspec.structs.FieldInfo) -> Any:
    if info.default is not msgspec.NODEFAULT:
        return info.default
    if info.default_factory is not msgspec.NODEFAULT:
        return info.default_factory()
    return None  # a required field (--model): the CLI fills it in


def argument_kwargs(flag: Flag, info: msgspec.structs.FieldInfo) -> dict[str, Any]:
    """``add_argument`` keywords of ``flag``, which sets the field ``info``."""
    default = _default(info)
    if flag.env is not None:
        default = os.environ.get(flag.env) or default
    kw: dict[str, Any] = {"help": flag.help, "default": default}
    tp = _without_none(info.type)
    if tp is bool:
        return kw | {"action": "store_true"}
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        return kw | {"choices": list(choices), "type": type(choices[0])}
    if typing.get_origin(tp) is tuple:
        return kw | {"type": batch_sizes, "default": ",".join(map(str, default))}
    return kw | {"type": finite_float if tp is float else tp}


def fields_of(group: Group) -> dict[str, msgspec.structs.FieldInfo]:
    """The fields of ``group``'s struct, by name."""
    return {f.name: f for f in msgspec.structs.fields(group.struct)}


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``serve`` and its flags, one argument group per ``Group``, to the ``houchu``
    command's subparsers; return the ``serve`` parser."""
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI API) and WebSocket",
        formatter_class=_DefaultsFormatter,
        allow_abbrev=False,  # every flag by its one name: no prefix spellings
    )
    for group in GROUPS:
        g = p.add_argument_group(group.title)
        fields = fields_of(group)
        for flag in group.flags:
            g.add_argument(flag.name, *flag.aliases, **argument_kwargs(flag, fields[flag.field]))
    return p


def group_values(group: Group, args: argparse.Namespace) -> dict[str, Any]:
    """The values of ``group``'s flags in parsed arguments, by field."""
    return {f.field: getattr(args, f.field) for f in group.flags}


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The configuration of parsed, checked arguments (``houchu.options.checks``): each
    flag's value goes to the field it names, converted by msgspec, so that each field's
    bounds hold. ``args.model`` must be the model's path.

    Raises:
        msgspec.ValidationError: a value out of its field's bounds (``check_serve_args``
            refuses it first, naming the flag).
    """
    parts: dict[str, Any] = {}
    for group in GROUPS:
        values = group_values(group, args)
        if group.attr is None:
            parts.update(values)
        else:
            parts[group.attr] = msgspec.convert(values, group.struct)
    return ServeConfig(**parts)
