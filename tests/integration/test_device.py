"""``houchu serve`` with a CUDA device torch does not see, or a misspelt one, stops at
once with one line (a process of its own each)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_serve_on_cuda_without_a_gpu_fails_with_one_line(tmp_path, device):
    model = tmp_path / "m.gguf"
    model.touch()
    out = subprocess.run(
        [sys.executable, "-m", "houchu.cli", "serve", "--model", str(model), "--device", device],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [f"houchu: --device {device}: {lines[0].split(': ', 2)[2]}"]
    assert "torch sees no CUDA GPU" in lines[0] and "Traceback" not in out.stderr
    assert out.stdout == ""  # no actor was started


def test_a_misspelt_device_is_a_usage_error():
    out = subprocess.run(
        [sys.executable, "-m", "houchu.cli", "serve", "--device", "gpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--device must be auto, cpu, cuda or cuda:N" in out.stderr
    assert "Traceback" not in out.stderr
