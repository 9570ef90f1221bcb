"""The compiled decode step (torch.compile, CPU) and the static decode step that CUDA
graphs capture, against the eager path (tiny random model)."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.gpu.cuda_graph import StaticDecode
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.batch import build_batch
from houchu.model.kv.pool import KVPool
from houchu.model.weights.loader import load_model
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SeqWork
from tests.support.greedy import generate
from tests.support.runner_options import exact


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("accel"), seed=11)


@pytest.mark.slow
def test_compiled_decode_gives_identical_greedy_tokens(tiny_dir):
    eager = ModelRunner(tiny_dir, exact(page_size=4, num_pages=24), quiet=True)
    comp = ModelRunner(
        tiny_dir,
        exact(page_size=4, num_pages=24, compile="on", decode_batch_sizes=(4,)),
        quiet=True,
    )
    assert comp.accel.kind == "compiled_decode" and comp.accel.setup_s > 0
    assert generate(comp) == generate(eager)
    (s,) = [s for s in comp.lever_samples() if s.lever == "compiled_decode"]
    assert s.spent == pytest.approx(comp.accel.setup_s) and s.spent_unit == "seconds"


def test_compile_policy_checked(tiny_dir):
    with pytest.raises(ValueError, match="compile must be"):
        ModelRunner(tiny_dir, exact(page_size=4, num_pages=8, compile="yes"), quiet=True)


def test_compile_failure_under_auto_decodes_eagerly(tiny_dir, monkeypatch, capsys):
    """No working C++ compiler (or any Inductor error): "auto" serves eagerly and says
    why; "on" raises."""
    from houchu.cpu.compiled import CompiledDecode

    def broken(self, buckets=None):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(CompiledDecode, "warmup", broken)
    r = ModelRunner(tiny_dir, exact(page_size=4, num_pages=24, compile="auto"), quiet=True)
    assert r.accel.impl is None and r.accel.dropped
    assert "torch.compile failed (InvalidCxxCompiler" in capsys.readouterr().err
    assert generate(r) == generate(
        ModelRunner(tiny_dir, exact(page_size=4, num_pages=24), quiet=True)
    )
    with pytest.raises(RuntimeError, match="InvalidCxxCompiler"):
        ModelRunner(tiny_dir, exact(page_size=4, num_pages=24, compile="on"), quiet=True)


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_static_decode_matches_eager(tiny_dir, kv):
    """The fixed-shape step CUDA graphs replay (padding rows on the scratch page)."""
    model = load_model(tiny_dir)
    pools = [
        KVPool.for_model(
            model.cfg, page_size=4, dtype=model.dtype, num_pages=16, kv_dtype=kv, scratch_pages=1
        )
        for _ in range(2)
    ]
    backend = TorchSDPABackend()
    static = StaticDecode(model, pools[1], backend, (2, 4))
    prompts = {"a": [5, 6, 7, 8, 9], "b": [10, 11], "c": [12, 13, 14]}
    tables = {r: [i * 3, i * 3 + 1, i * 3 + 2] for i, r in enumerate(prompts)}

    def batch(items):
        work = [
            SeqWork(rid=r, token_ids=t, start_pos=s, page_table=tables[r], sample=True)
            for r, t, s in items
        ]
        return build_batch(work, page_size=4, num_pages=16, max_context=12, vocab_size=128)

    with torch.inference_mode():
        pre = batch([(r, p, 0) for r, p in prompts.items()])
        for pool in pools:
            model(pre, pool, backend)
        step = batch([(r, [20 + i], len(p)) for i, (r, p) in enumerate(prompts.items())])
        assert static.bucket(step) == 4
        want = model(step, pools[0], backend)
        got = static.forward(step, pools[1], backend, 4)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pools[1].k[:, :16], pools[0].k[:, :16])  # scratch page aside


@pytest.mark.slow
def test_a_known_slower_compile_is_not_measured_again(tiny_dir, monkeypatch, tmp_path):
    """compile "auto": a verdict "not faster" is cached, and the next start skips the
    compilation and says so."""
    import houchu.runner.accel as accel

    monkeypatch.setenv("HOUCHU_DECISION_CACHE", str(tmp_path / "decisions.json"))
    monkeypatch.setattr(accel, "KEEP_BELOW", 0.0)  # compiled is never faster enough
    options = exact(page_size=4, num_pages=24, compile="auto", decode_batch_sizes=(1, 2))
    first = ModelRunner(tiny_dir, options, quiet=True)
    assert first.accel.dropped and not first.accel.cached and first.accel.setup_s > 0
    second = ModelRunner(tiny_dir, options, quiet=True)
    assert second.accel.dropped and second.accel.cached and second.accel.setup_s == 0
    assert "cached measurement" in second.levers.summary()
    assert second.accel.eager_step_s == first.accel.eager_step_s
