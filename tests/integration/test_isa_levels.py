"""The exact path (float32, ``--quantization none``) gives the same greedy tokens at every
ISA level this CPU runs, the torch fallback (``generic``: no C++ kernels) included, on the
real model; and a level the CPU cannot run is refused with one clear error."""

from __future__ import annotations

import pytest

from houchu.gpu import cpu_isa, cpu_kernels
from houchu.gpu.runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

pytestmark = pytest.mark.slow

PROMPTS = {  # token ids of three short English / code prompts (SmolLM2's tokenizer)
    "a": [504, 3575, 282, 4649, 314],
    "b": [767, 28610, 30, 94, 392],
    "c": [16508, 2056, 253, 655, 28, 281, 253, 1165],
}


def _greedy(r: ModelRunner, steps: int = 16) -> dict[str, list[int]]:
    g = SamplingParams(temperature=0.0, ignore_eos=True)
    tables = {x: list(range(i * 4, i * 4 + 4)) for i, x in enumerate(PROMPTS)}
    init = [SeqInit(rid=x, sampling=g, prompt_ids=p) for x, p in PROMPTS.items()]
    work = [
        SeqWork(rid=x, token_ids=p, start_pos=0, page_table=tables[x], sample=True)
        for x, p in PROMPTS.items()
    ]
    out: dict[str, list[int]] = {x: [] for x in PROMPTS}
    for o in r.execute(StepPlan(step_id=0, init=init, work=work)).outputs:
        out[o.rid].append(o.token_id)
    for s in range(steps):
        work = [
            SeqWork(
                rid=x,
                token_ids=[out[x][-1]],
                start_pos=len(p) + s,
                page_table=tables[x],
                sample=True,
            )
            for x, p in PROMPTS.items()
        ]
        for o in r.execute(StepPlan(step_id=s + 1, work=work)).outputs:
            out[o.rid].append(o.token_id)
    return out


def test_exact_path_is_identical_at_every_level(real_model_path):
    before = cpu_kernels.active_level()
    tokens, kernels = {}, {}
    try:
        for level in cpu_isa.usable():
            r = ModelRunner(
                real_model_path, quantization="none", num_pages=16, cpu_isa=level, quiet=True
            )
            kernels[level] = r.backend.name
            tokens[level] = _greedy(r)
    finally:
        cpu_kernels.select(before)
    assert kernels["generic"] == "torch-sdpa"  # the fallback really runs torch's kernels
    assert all(k == "cpu" for lv, k in kernels.items() if lv != "generic"), kernels
    first = next(iter(tokens.values()))
    assert all(len(t) == 17 for t in first.values())
    for level, t in tokens.items():
        assert t == first, (level, t, first)


def test_a_level_the_cpu_lacks_is_refused(real_model_path, monkeypatch):
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda cpuinfo=None: frozenset({"sse2"}))
    with pytest.raises(ValueError, match="lacks .*avx2"):
        ModelRunner(real_model_path, quantization="none", num_pages=16, cpu_isa="avx2", quiet=True)
    assert cpu_isa.usable() == ["generic"]
