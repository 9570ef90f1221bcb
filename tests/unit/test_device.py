"""``--device`` reaches the model runner; a CUDA device torch does not see is refused
before loading (``houchu serve``'s one line: ``tests/integration/test_device.py``)."""

from __future__ import annotations

import pytest
import torch
import zmq.asyncio

from houchu.actors.runner import RunnerActor
from houchu.cli.main import build_parser
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.device import DeviceError, resolve_device
from houchu.options.checks import check_serve_args
from houchu.options.parser import config_from_args
from houchu.options.serve_config import Launch
from houchu.runner.model_runner import ModelRunner
from houchu.transport.endpoints import Endpoints
from tests.support.runner_options import exact

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_device_flag_reaches_the_model_runner(tmp_path, monkeypatch, device):
    """``houchu serve --device D``: the runner actor builds its ``ModelRunner`` with D."""
    model = tmp_path / "m.gguf"
    model.touch()
    parser = build_parser()
    args = parser.parse_args(["serve", "--model", str(model), "--device", device])
    check_serve_args(parser, args)
    config = config_from_args(args)
    config = config.with_launch(endpoints=Endpoints.inproc(f"device-{device}"))
    built = []
    import houchu.runner.model_runner

    monkeypatch.setattr(houchu.runner.model_runner, "ModelRunner", lambda *a: built.append(a))
    ctx = zmq.asyncio.Context()
    try:
        RunnerActor(ctx, config)._load()
    finally:
        ctx.destroy(linger=0)
    ((path, options),) = built
    assert path == str(model) and options.device == device and options is config.runner


def test_default_device_is_auto():
    assert build_parser().parse_args(["serve"]).device == "auto"
    assert isinstance(Launch().endpoints, Endpoints)


def test_model_runner_runs_on_the_device_it_is_given(tmp_path):
    path = make_tiny_llama(tmp_path / "tiny", seed=3)
    r = ModelRunner(path, exact(device="auto", page_size=4, num_pages=8), quiet=True)
    assert r.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert r.info().device_type == r.device.type
    # torch attention: on a GPU machine's check, no build of the C++ CPU kernels
    cpu_opts = exact(device="cpu", page_size=4, num_pages=8, attention_backend="torch")
    cpu = ModelRunner(path, cpu_opts, quiet=True)
    assert cpu.device == torch.device("cpu")


@no_cuda
def test_cuda_without_a_gpu_is_refused_before_loading(tmp_path):
    with pytest.raises(DeviceError, match="--device cuda: torch sees no CUDA GPU"):
        ModelRunner(tmp_path / "not-even-a-model", exact(device="cuda"), quiet=True)
    with pytest.raises(DeviceError, match="cuda:N"):
        resolve_device("gpu")


def test_the_current_cuda_device_follows_an_indexed_device():
    """A runner on "cuda:N" makes GPU N the current device (CUDA graphs and Triton
    launch there); the CPU and a bare "cuda" leave torch's current device alone."""
    from houchu.model.device import cuda_index, make_current

    assert [cuda_index(d) for d in ("cpu", "cuda", "cuda:1", torch.device("cuda:0"))] == [
        None,
        None,
        1,
        0,
    ]
    assert make_current("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():  # the call reaches torch.cuda.set_device
        with pytest.raises((AttributeError, AssertionError, RuntimeError)):
            make_current("cuda:0")
        return
    before = torch.cuda.current_device()
    last = torch.cuda.device_count() - 1
    try:
        assert make_current(f"cuda:{last}") == torch.device(f"cuda:{last}")
        assert torch.cuda.current_device() == last
    finally:
        torch.cuda.set_device(before)
