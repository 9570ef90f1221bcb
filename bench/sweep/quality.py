"""What a lossy lever spends in accuracy: top-1 agreement and the mean |Δlogprob| of the
text's next tokens against the exact path (``houchu.model.quant.quality``), on a fixed text.

Measured in the sweep's own process after the servers ran (never beside them), each
model loaded once. The exact path is the model with unquantized weights and a KV pool
in the model dtype.
"""

from __future__ import annotations

from pathlib import Path

from houchu.bench.texts import QUALITY_EN

#: Tokens of the text compared (the start of it).
MAX_TOKENS = 512


def measure_quality(
    model_path: Path, cases: dict[str, tuple[str, str]], dtype: str, text_path: Path | None
) -> dict[str, dict[str, float | int | str]]:
    """Agreement of each lossy lever's model with the exact path.

    Args:
        model_path: the model served.
        cases: ``{lever: (weights, kv_dtype)}`` (``houchu.bench.sweep.levers.Lever.lossy``).
        dtype: the model dtype the servers ran (``float32``, ``bfloat16``).
        text_path: the text (default :data:`houchu.bench.texts.QUALITY_EN`).

    Returns:
        ``{lever: {"top1", "mean_abs_dlogp", "positions"}}``, or ``{lever: {"error":
        why}}`` where it could not be measured (no text, a model that does not load).
    """
    if not cases:
        return {}
    path = text_path or QUALITY_EN
    if not path.exists():
        return {k: {"error": f"no quality text at {path} (--quality-text)"} for k in cases}
    import torch

    from houchu.model.quant.functions import QuantSpec
    from houchu.model.quant.quality import agreement, text_logprobs
    from houchu.model.weights.loader import load_model
    from houchu.text.tokenizer.core import load_tokenizer

    ids = load_tokenizer(model_path).encode(path.read_text(encoding="utf-8"))[:MAX_TOKENS]
    torch_dtype = getattr(torch, dtype or "float32")
    models: dict[str, object] = {}

    def model(weights: str):  # noqa: ANN202
        if weights not in models:
            quant = None if weights == "none" else QuantSpec(weights)
            models[weights] = load_model(model_path, torch_dtype, quant=quant)
        return models[weights]

    out: dict[str, dict[str, float | int | str]] = {}
    try:
        exact = text_logprobs(model("none"), ids)
    except Exception as exc:  # noqa: BLE001 - reported per lever, the sweep's results stand
        return {k: {"error": f"exact path failed: {exc}"} for k in cases}
    for name, (weights, kv) in cases.items():
        try:
            got = text_logprobs(model(weights), ids, kv_dtype=kv)
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        a = agreement(exact, got, ids)
        out[name] = {"top1": a.top1, "mean_abs_dlogp": a.mean_abs_dlogp, "positions": a.positions}
    return out
