"""Which reader a model path takes: a ``.gguf`` file (``houchu.model.config.gguf``) or a
Hugging Face directory (``houchu.model.config.hf``), each building a ``ModelConfig``
(``houchu.model.config.core``). It sits above the readers, which import the core."""

from __future__ import annotations

from pathlib import Path

from houchu.model.config.core import ModelConfig, ModelLoadError
from houchu.model.config.gguf import config_from_gguf
from houchu.model.config.hf import config_from_hf


def load_model_config(path: str | Path) -> ModelConfig:
    """Read a model's configuration.

    Args:
        path: a ``.gguf`` file, or a Hugging Face model directory holding ``config.json``.
    Returns:
        The ``ModelConfig``.
    Raises:
        ModelLoadError: the path does not exist, the metadata is incomplete, or the
            architecture is not one of ``ARCHITECTURES``.
    """
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return config_from_gguf(p)
    if p.is_dir() and (p / "config.json").is_file():
        return config_from_hf(p)
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return config_from_gguf(ggufs[0])
    raise ModelLoadError(
        f"{path}: expected a .gguf file or a Hugging Face directory with config.json"
    )
