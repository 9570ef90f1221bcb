"""Checks of ``houchu serve``'s parsed arguments, and what they normalize.

``check_serve_args`` calls ``parser.error`` (exit status 2 with a message) on the first
bad value; ``check_device`` is the one check that asks torch, run before the actors
start. The messages name the flags.

A flag's own bounds are its field's msgspec constraints (``houchu.options.bounds``),
checked first by converting each group's values to its struct; the checks here are the
rest: one flag against another, files that must exist, what this machine runs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from houchu.cpu import isa
from houchu.model.device import DeviceError, check_device_name, resolve_device
from houchu.options.bounds import bound_error
from houchu.options.flags import GROUPS
from houchu.options.parser import group_values
from houchu.options.runner_options import RunnerOptions


def _check_bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each flag's value within its field's bounds (``houchu.options.bounds``)."""
    for group in GROUPS:
        if group.attr is None:  # --model, --chat-template: no bounds
            continue
        bad = bound_error(group.struct, group_values(group, args))
        if bad is not None:
            field, rule = bad
            flag = next((f.name for f in group.flags if f.field == field), "")
            parser.error(f"{flag} {rule}" if flag else rule)


def _check_runner(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        check_device_name(args.device)
    except DeviceError as e:
        parser.error(str(e))
    try:  # the flag, or $HOUCHU_CPU_ISA under --cpu-isa auto
        isa.choose(args.cpu_isa)
    except ValueError as e:
        parser.error(str(e))
    _check_gptq(parser, args)


def _check_gptq(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--int4-method gptq`` makes int4 weights on one process; ``--calibration-text``
    is read by it alone (and becomes absolute)."""
    gptq = args.int4_method == "gptq"
    if gptq and args.quantization != "int4":  # auto is int4 only for a Q4 GGUF: no GPTQ
        parser.error(
            "--int4-method gptq makes int4 weights from float ones: add --quantization int4"
            if args.quantization == "auto"
            else f"--int4-method gptq makes int4 weights: not with --quantization "
            f"{args.quantization}"
        )
    if args.calibration_text is not None and not gptq:
        parser.error("--calibration-text is GPTQ's: add --int4-method gptq")
    if gptq and args.tensor_parallel_size > 1:
        parser.error("--int4-method gptq does not combine with --tensor-parallel-size > 1 yet")
    if args.calibration_text is not None:
        if not Path(args.calibration_text).is_file():
            parser.error(f"--calibration-text {args.calibration_text}: no such file")
        if not _has_text(Path(args.calibration_text)):
            parser.error(f"--calibration-text {args.calibration_text}: the file holds no text")
        args.calibration_text = str(Path(args.calibration_text).resolve())


def _has_text(path: Path) -> bool:
    """Whether ``path`` holds anything but whitespace (read 64 KiB at a time).

    Raises:
        OSError: it cannot be read.
    """
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return True
    return False


def _check_chat_template(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--chat-template``: a known name, a Jinja file (made absolute) or an inline
    template that compiles; anything else is one line here, before any actor starts."""
    if args.chat_template is None:
        return
    from houchu.text.chat_templates import KNOWN_TEMPLATES, ChatTemplateError, flag_template

    try:
        _, what = flag_template(args.chat_template)
    except ChatTemplateError as e:
        parser.error(str(e))
    if args.chat_template not in KNOWN_TEMPLATES and what != "inline":
        args.chat_template = what  # the file's absolute path: the actors read it


def _check_tiers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.ssd_kv_mb and not (args.host_kv_mb or args.host_kv_pages):
        parser.error("--ssd-kv-mb needs a host tier (--host-kv-mb or --host-kv-pages)")
    if (args.host_kv_mb or args.host_kv_pages) and args.disable_radix_cache:
        parser.error("the KV tiers sit below the radix cache: drop --disable-radix-cache")


def _check_spec(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Also: ``--draft-model`` implies ``--speculative draft`` and becomes absolute."""
    if args.draft_model is not None:
        if args.speculative in ("ngram", "mtp"):
            parser.error("--draft-model needs --speculative draft (or no --speculative)")
        args.speculative = "draft"
        if not Path(args.draft_model).exists():
            parser.error(f"--draft-model: {args.draft_model} does not exist")
        args.draft_model = str(Path(args.draft_model).resolve())
    if args.speculative == "draft" and args.draft_model is None:
        parser.error("--speculative draft needs --draft-model PATH")
    if args.speculative is not None and args.deterministic:
        parser.error(
            "--deterministic does not combine with --speculative (verification runs other "
            "attention kernels than decode)"
        )


def _check_deterministic(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--deterministic``'s refusals that the flags alone decide (the runner's own
    ``houchu.runner.deterministic.check_options``), before any actor starts."""
    if not args.deterministic:
        return
    import torch

    from houchu.runner.deterministic import DeterministicUnsupported, check_options

    o = RunnerOptions(
        quantization=args.quantization,
        int4_activations=args.int4_activations,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    device = torch.device("cuda" if args.device.startswith("cuda") else "cpu")
    try:
        check_options(o, device)
    except DeterministicUnsupported as e:
        parser.error(str(e))
    if isa.choose(args.cpu_isa) == "generic" and args.quantization != "none":
        parser.error(
            "--deterministic needs houchu's C++ CPU kernels for quantized weights: drop "
            "--cpu-isa generic (or serve the exact path, --quantization none)"
        )


def _check_gateway(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Also: ``--api-key`` loses surrounding blanks."""
    if args.api_key is not None and not args.api_key.strip():
        parser.error("--api-key must not be empty")
    args.api_key = args.api_key.strip() if args.api_key else None
    if args.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"houchu: warning: listening on {args.host} without an API key (--api-key)",
            file=sys.stderr,
        )


def _check_telemetry(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.db_url is not None:
        from houchu.storage.db import DatabaseUrlError, parse_url

        try:
            url = parse_url(args.db_url)
            url.get_dialect()  # an unknown scheme fails here, not in every actor
        except DatabaseUrlError as e:
            parser.error(f"--db-url: {e}")
        except Exception as e:  # noqa: BLE001 (SQLAlchemy raises NoSuchModuleError and others)
            parser.error(f"--db-url: {args.db_url!r}: {e}")


def _check_cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    tp = args.tensor_parallel_size
    if tp > 1 and args.data_parallel_size > 1:
        parser.error("--tensor-parallel-size > 1 does not combine with --data-parallel-size yet")
    if tp > 1 and (args.host_kv_mb or args.host_kv_pages):
        parser.error("--tensor-parallel-size > 1 does not combine with the KV tiers yet")
    try:
        shlex.split(args.router_args)
    except ValueError as e:
        parser.error(f"--router-args: {e}")
    from houchu.options.cluster_options import ClusterOptions

    router = args.router_policy != ClusterOptions().router_policy or args.router_args
    if router and args.data_parallel_size == 1:
        parser.error("--router-policy and --router-args set the router of --data-parallel-size > 1")


def check_serve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate ``houchu serve``'s arguments, group by group; ``parser.error`` (exit 2
    with a message) on the first bad one. Normalizes ``args.api_key``,
    ``args.draft_model``, ``args.speculative`` and ``args.chat_template`` (see the
    group checks)."""
    _check_bounds(parser, args)
    _check_chat_template(parser, args)
    _check_runner(parser, args)
    _check_tiers(parser, args)
    _check_spec(parser, args)
    _check_deterministic(parser, args)
    _check_gateway(parser, args)
    _check_telemetry(parser, args)
    _check_cluster(parser, args)


def check_tensor_parallel(runner: RunnerOptions, model: str) -> str | None:
    """Why ``--tensor-parallel-size`` cannot run ``model`` with these options, in one
    line (None: it can, or it is 1). Reads the model's configuration only."""
    if runner.tensor_parallel_size == 1:
        return None
    from houchu.model.config.core import ModelLoadError
    from houchu.runner.tensor_parallel.ranks import check_model, tp_runner_options
    from houchu.runner.tensor_parallel.shards import TensorParallelError

    try:
        check_model(model, tp_runner_options(runner)[0])
    except (TensorParallelError, ModelLoadError) as e:
        return str(e)
    return None


def check_device(args: argparse.Namespace) -> str | None:
    """Why ``--device`` cannot run here, in one line (None: it can, or it is "auto" or
    "cpu", which always can; only a CUDA device imports torch here)."""
    if not args.device.startswith("cuda"):
        return None
    try:
        resolve_device(args.device)
    except DeviceError as e:
        return str(e)
    return None


def check_mtp(speculative: str | None, model: str) -> str | None:
    """Why ``--speculative mtp`` cannot run ``model``, in one line (None: it can, or MTP
    is not asked for). Reads the model's configuration and safetensors headers only, so
    a GGUF file or a checkpoint without MTP layers is refused before anything loads."""
    if speculative != "mtp":
        return None
    from houchu.model.mtp import MTPUnavailable, mtp_layer_index

    try:
        mtp_layer_index(model)
    except MTPUnavailable as e:
        return str(e)
    return None
