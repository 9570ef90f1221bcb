"""Quantized weights of a real checkpoint against its exact path, printed: top-1
next-token agreement and mean |Δ log p| on a fixed text, with each variant's load time
and weight bytes per decode step.

    python -m houchu.bench.model.quant --model PATH [--variants auto,int8,int4,int4-gptq]
        [--text bench/data/quality_en.txt] [--tokens 600] [--calibration-text FILE]
        [--json OUT]

The exact path is the checkpoint's weights dequantized (``--quantization none``); each
variant is loaded as ``houchu serve`` would load it ("auto": houchu serve's default, a
GGUF's tensors as stored where it can, ``houchu.model.gguf.blocks``; each row then says
which stored types it served; "int4-gptq": ``--quantization int4
--int4-method gptq``, calibrated on ``--calibration-text`` or the default text, never the
evaluated one) and fed the text in chunks of 48 tokens (the weight-only kernels' rows),
on houchu's C++ CPU kernels where they build (as the server's runner computes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from houchu.bench.texts import QUALITY_EN
from houchu.cpu import kernels as cpu_kernels
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.mode import resolve_quant_mode
from houchu.model.quant.quality import agreement, text_logprobs
from houchu.model.weights.loader import STORED_NOTE, load_model
from houchu.text.tokenizer.core import load_tokenizer

CHUNK = 48  #: tokens per step


def spec(variant: str, calibration: str | None) -> QuantSpec:
    """The ``QuantSpec`` a variant names ("none", "int8", "w8a8", "int4", "int4-minmax",
    "int4-gptq"; "auto" is resolved per model by ``resolve_quant_mode`` in ``run``).

    Raises:
        ValueError: an unknown variant.
    """
    mode, _, method = variant.partition("-")
    if mode == "auto" and not method:
        return QuantSpec("none")  # a placeholder: ``run`` resolves it for the model
    if method and mode != "int4":
        raise ValueError(f"unknown variant {variant!r}")
    return QuantSpec(mode, 32, int4_method=method or "mse", calibration=calibration)


def run(model_path: str, variants: list[str], ids: list[int], calibration: str | None) -> dict:
    """Each variant's figures against the exact path (``--quantization none``) on ``ids``.

    Returns:
        ``{"exact": {...}, variant: {"top1", "mean_abs_dlogp", "load_s", "weight_mib",
        "stored"}}`` ("stored": the GGUF types served as stored, e.g. "Q4_K x27 int4, ...").
    """
    out: dict[str, dict] = {}
    try:  # the server's runner computes on houchu's C++ kernels where they build
        cpu_kernels.load()
    except cpu_kernels.CpuKernelsUnavailable as e:
        print(f"houchu's C++ kernels unavailable ({e}): torch's kernels serve")
    with torch.inference_mode():
        t0 = time.perf_counter()
        exact = load_model(model_path)
        load_s = time.perf_counter() - t0
        ref = text_logprobs(exact, ids, chunk=CHUNK)  # [n, V]
        nxt = torch.tensor(ids[1:])[:, None]
        nll = -ref[:-1].gather(1, nxt).mean().item()
        out["exact"] = {"nats_per_token": nll, "load_s": load_s, "weight_mib": mib(exact)}
        del exact
        for v in variants:
            t0 = time.perf_counter()
            q = spec(v, calibration)
            if v == "auto":
                q = QuantSpec(resolve_quant_mode("auto", model_path))
            model = load_model(model_path, quant=q)
            load_s = time.perf_counter() - t0
            a = agreement(ref, text_logprobs(model, ids, chunk=CHUNK), ids)
            out[v] = {
                "top1": a.top1,
                "mean_abs_dlogp": a.mean_abs_dlogp,
                "load_s": load_s,
                "weight_mib": mib(model),
                "stored": _stored(model),
            }
            del model
    return out


def _stored(model) -> str:  # noqa: ANN001 (a LlamaModel)
    """The start-up note's list of GGUF types served as stored, or "-"."""
    notes = [n for n in model.load_notes if n.startswith(STORED_NOTE)]
    return notes[0].removeprefix(STORED_NOTE) if notes else "-"


def mib(model) -> float:  # noqa: ANN001 (a LlamaModel)
    """Matmul weight MiB one decode step reads, as stored."""
    return model.weight_bytes()[0] / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a GGUF file or Hugging Face folder")
    ap.add_argument("--variants", default="auto,int8,int4,int4-gptq")
    ap.add_argument("--text", default=str(QUALITY_EN), help="the evaluated text (UTF-8)")
    ap.add_argument("--tokens", type=int, default=600, help="evaluated tokens at most")
    ap.add_argument("--calibration-text", default=None, help="GPTQ's text (default: pydoc_data)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    ids = load_tokenizer(args.model).encode(Path(args.text).read_text())[: args.tokens]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        spec(v, args.calibration_text)  # an unknown variant fails before any load
    res = run(args.model, variants, ids, args.calibration_text)
    e = res["exact"]
    print(
        f"{Path(args.model).name}: {len(ids)} tokens of {Path(args.text).name}, exact path "
        f"{e['nats_per_token']:.3f} nats/token, {e['weight_mib']:.1f} MiB/step, "
        f"loaded in {e['load_s']:.1f}s"
    )
    print(f"{'variant':<12}{'top-1':>8}{'|dlogp|':>10}{'MiB/step':>10}{'load s':>8}  stored")
    for v in variants:
        r = res[v]
        print(
            f"{v:<12}{r['top1']:>8.3f}{r['mean_abs_dlogp']:>10.4f}"
            f"{r['weight_mib']:>10.1f}{r['load_s']:>8.1f}  {r['stored']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
