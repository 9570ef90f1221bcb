"""GPTQ int4 weights (``houchu.model.quant.gptq``): the algorithm against plain rounding on
correlated inputs, its exact reduction to rounding when the inputs are uncorrelated, the
calibration Hessians, and a model quantized through ``load_model`` and the serve flags.
Agreement with the exact path on the trained families: test_family_quant_quality.py."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_model, write_tiny_tokenizer
from houchu.model.linear.dense import Linear
from houchu.model.linear.quantized import Int4Linear, Int8Linear
from houchu.model.quant.calibration import calibration_ids, calibration_text
from houchu.model.quant.functions import QuantSpec, quantize_int4
from houchu.model.quant.gptq import collect_hessians, gptq_int4, quantize_model_gptq
from houchu.model.weights.loader import load_model

pytestmark = pytest.mark.slow

GS = 32


def correlated_inputs(t: int, k: int, seed: int) -> torch.Tensor:
    """``[t, k]`` inputs whose columns correlate (mixed from fewer sources) and
    differ in size (a few outlier columns), as a transformer layer's inputs do."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k // 4, generator=g) @ torch.randn(k // 4, k, generator=g)  # [t, k]
    x[:, :4] *= 8.0
    return x + 0.1 * torch.randn(t, k, generator=g)


def output_error(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    """``‖x wᵀ - x wqᵀ‖²``: how far the layer's outputs move."""
    return float(((x @ (w - wq).T) ** 2).sum())


def test_gptq_moves_the_outputs_less_than_rounding():
    """On correlated inputs, GPTQ's weights change the layer's outputs (on the same
    inputs) much less than the error-minimising rounding does."""
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(1))  # [N, K]
    x = correlated_inputs(512, 128, seed=2)  # [T, K]
    rtn = quantize_int4(w, GS).dequantize()
    gptq = gptq_int4(w, x.T @ x, GS).dequantize()
    e_rtn, e_gptq = output_error(x, w, rtn), output_error(x, w, gptq)
    assert e_gptq < 0.5 * e_rtn, (e_gptq, e_rtn)
    # the weights themselves move more: the error went where the inputs do not look
    assert ((w - gptq) ** 2).sum() > ((w - rtn) ** 2).sum()


def test_uncorrelated_inputs_leave_plain_rounding():
    """With ``H`` diagonal no column's error reaches another: GPTQ's codes are each
    weight rounded to its group's nearest level (the groups' scales and offsets as
    ``quantize_int4`` fits them)."""
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    h = torch.diag(torch.linspace(0.5, 4.0, 64))
    q = gptq_int4(w, h, GS)
    want = quantize_int4(w, GS)
    torch.testing.assert_close(q.scale, want.scale)
    torch.testing.assert_close(q.offset, want.offset)
    assert torch.equal(q.q, want.q)


def test_columns_no_input_reached_are_zero_and_the_rest_stay_finite():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))
    x = correlated_inputs(256, 64, seed=5)
    x[:, 7] = 0.0
    deq = gptq_int4(w, x.T @ x, GS).dequantize()
    assert torch.isfinite(deq).all()
    assert deq[:, 7].abs().max() < 0.5 * w[:, 7].abs().max()


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="Hessian"):
        gptq_int4(torch.randn(4, 64), torch.eye(32), GS)
    with pytest.raises(ValueError, match="group size"):
        gptq_int4(torch.randn(4, 48), torch.eye(48), GS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama beside a byte tokenizer."""
    path = make_tiny_model(tmp_path_factory.mktemp("gptq") / "hf", "llama", seed=3)
    write_tiny_tokenizer(path, 128)
    return path


def test_hessians_are_the_inputs_second_moments(tiny):
    """One Hessian per dense projection but the LM head; layer 0's qkv input is the
    normed embedding, so its Hessian is that matrix's ``xᵀx``."""
    model = load_model(tiny, prepack=False)
    ids = list(range(3, 100))
    hs = collect_hessians(model, ids, window=40)
    names = {n for n, m in model.named_modules() if isinstance(m, Linear)} - {"lm_head"}
    assert set(hs) == names
    layer = model.layers[0]
    with torch.inference_mode():
        x = layer.input_norm(torch.nn.functional.embedding(torch.tensor(ids), model.embed))
    torch.testing.assert_close(hs["layers.0.qkv"], x.T @ x, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="2 calibration tokens"):
        collect_hessians(model, [5])


def test_a_model_quantized_by_gptq(tiny):
    """Every projection int4, the LM head int8 (as int4's head), the label says GPTQ;
    the logits keep the exact model's direction (a random model's int4 logits move by
    a fifth of their size: the trained families' agreement is measured elsewhere)."""
    exact = load_model(tiny)
    model = load_model(tiny, prepack=False)
    quant = QuantSpec("int4", GS, int4_method="gptq")
    assert quantize_model_gptq(model, list(range(3, 128)) * 4, quant) == (2 * 4, 0)
    body = [m for n, m in model.named_modules() if n.startswith("layers.") and hasattr(m, "kind")]
    assert body and all(isinstance(m, Int4Linear) for m in body)
    assert isinstance(model.lm_head, Int8Linear)
    assert model.quant.label() == "int4-g32-gptq"
    with pytest.raises(RuntimeError, match="dense model"):
        quantize_model_gptq(model, list(range(3, 50)), quant)
    from tests.support.families import Runner, prompt

    ids = prompt(1, 12)
    want = Runner(exact).step([("a", ids, 0)])[0]
    got = Runner(model).step([("a", ids, 0)])[0]
    assert torch.nn.functional.cosine_similarity(got.float(), want.float(), dim=0) > 0.9


def test_load_model_reads_the_calibration_text(tiny, tmp_path):
    """``load_model`` with ``int4_method="gptq"`` tokenizes the calibration file with the
    model's tokenizer (or reads the default text) and quantizes by GPTQ."""
    text = tmp_path / "calib.txt"
    text.write_text("The cooks start the stock at six and taste it at noon. " * 20)
    assert len(calibration_ids(tiny, text)) > 100
    for source in (str(text), None):
        quant = QuantSpec("int4", GS, int4_method="gptq", calibration=source)
        model = load_model(tiny, quant=quant)
        assert isinstance(model.layers[1].down, Int4Linear)
    assert "Python" in calibration_text(None)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        calibration_text(empty)
    with pytest.raises(ValueError, match="calibration-text"):
        calibration_text(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="int4 method"):
        QuantSpec("int4", GS, int4_method="awq")


def test_gptq_on_stored_q4_weights_is_said_and_not_labelled(real_model_path):
    """The default GGUF's projections are Q4_1, kept int4 as stored: ``--int4-method
    gptq`` does not apply to them, the model says so at start-up and its label is plain
    int4."""
    from houchu.runner.load import load_runner_model
    from tests.support.runner_options import exact

    opts = exact(quantization="int4", int4_method="gptq")
    model, quant = load_runner_model(
        real_model_path, opts, torch.float32, torch.device("cpu"), prepack=False
    )
    assert quant.label() == "int4-g32" and model.quant == quant
    assert any("--int4-method gptq not applied" in n for n in model.load_notes)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--int4-method", "gptq"], "add --quantization int4"),
        (["--quantization", "int8", "--int4-method", "gptq"], "not with --quantization int8"),
        (
            ["--quantization", "int4", "--int4-method", "gptq", "--calibration-text", "EMPTY"],
            "holds no text",
        ),
    ],
)
def test_gptq_flags_that_cannot_apply_are_refused(argv, said, tmp_path, capsys):
    from houchu.cli.main import build_parser
    from houchu.options.checks import check_serve_args

    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\t\n")
    argv = [str(empty) if a == "EMPTY" else a for a in argv]
    parser = build_parser()
    with pytest.raises(SystemExit):
        check_serve_args(parser, parser.parse_args(["serve", *argv]))
    assert said in capsys.readouterr().err
