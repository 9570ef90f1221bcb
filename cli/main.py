"""The ``houchu`` command: ``houchu serve``, ``houchu fetch``, ``houchu bench`` and
``houchu levers``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import NoReturn

from houchu.bench.cli import add_bench_parser, run_bench
from houchu.bench.sweep.cli import add_levers_parser, run_levers
from houchu.model.fetch import FetchError, fetch_default_model
from houchu.options.checks import (
    check_device,
    check_mtp,
    check_serve_args,
    check_tensor_parallel,
)
from houchu.options.parser import add_serve_parser, config_from_args
from houchu.options.serve_config import ServeConfig


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("houchu")
    except PackageNotFoundError:
        return "unknown"


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose errors are one line and a pointer to ``--help``.

    ``houchu serve`` has some eighty flags: argparse's default error prints their whole
    usage block before the message, which buries the one line that matters. Exits with
    status 2, as argparse does."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` and the ``--help`` hint; exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``houchu`` argument parser (defaults that come from the environment, such as
    ``HOUCHU_API_KEY``, are read now)."""
    return build_parsers()[0]


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``(the houchu parser, its serve subparser)``: the checks of ``serve``'s values
    report through the latter (``houchu serve: error: ...``, one line)."""
    parser = argparse.ArgumentParser(prog="houchu", description="houchu LLM serving engine")
    parser.add_argument("--version", action="version", version=f"houchu {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=SubcommandParser)
    serve = add_serve_parser(sub)
    sub.add_parser("fetch", help="download the default model into the cache")
    add_bench_parser(sub)
    add_levers_parser(sub)
    return parser, serve


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``houchu`` console command; returns the exit code."""
    parser, serve = build_parsers()
    args = parser.parse_args(argv)

    if args.command == "bench":
        return run_bench(args)
    if args.command == "levers":
        return run_levers(args, sys.argv[1:] if argv is None else list(argv))

    if args.command == "fetch":
        try:
            print(fetch_default_model())
        except FetchError as e:
            print(f"houchu: {e}", file=sys.stderr)
            return 1
        return 0
    check_serve_args(serve, args)
    why = check_device(args)
    if why is not None:
        print(f"houchu: {why}", file=sys.stderr)
        return 2
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    """Fetch or find the model, then run the launcher until it stops; the exit code."""
    from houchu.actors.launcher import Launcher
    from houchu.actors.runtime import install_uvloop

    if args.model is None:
        try:
            args.model = str(fetch_default_model())
        except FetchError as e:
            print(f"houchu: {e}", file=sys.stderr)
            return 1
    elif not Path(args.model).exists():
        print(f"houchu: model path {args.model} does not exist", file=sys.stderr)
        return 2
    args.model = str(Path(args.model).resolve())
    config = config_from_args(args)
    why = check_tensor_parallel(config.runner, config.model)
    why = why or check_mtp(config.speculation.speculative, config.model)
    if why is not None:
        print(f"houchu: {why}", file=sys.stderr)
        return 2
    install_uvloop()
    if config.cluster.data_parallel_size > 1:
        return _serve_replicas(config)
    return asyncio.run(Launcher(config).serve())


def _serve_replicas(config: ServeConfig) -> int:
    """``--data-parallel-size N``: N replicas behind smg (``houchu.cluster``)."""
    from houchu.cluster.launcher import ClusterLauncher
    from houchu.cluster.plan import ClusterPlanError
    from houchu.cluster.router import RouterMissing

    try:
        launcher = ClusterLauncher(config)
    except (RouterMissing, ClusterPlanError) as e:
        print(f"houchu: {e}", file=sys.stderr)
        return 2
    return asyncio.run(launcher.serve())


if __name__ == "__main__":
    sys.exit(main())
