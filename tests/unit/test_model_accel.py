"""The compile policy and its fallback, and the static decode step that CUDA graphs
capture, against the eager path (tiny random model). The compiled step itself, which
starts the C++ compiler: ``tests/integration/test_model_accel.py``."""

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
