"""The texts houchu's quality measurements read: package data in ``bench/data/``.

``quality_en.txt`` (English prose), ``quality_code.txt`` (Python) and ``quality_zh.txt``
(Chinese) are what the lossy levers are scored on (top-1 agreement and mean |Δlogprob|
against the exact path, ``houchu.model.quant.quality``). They ship inside the package so
that an installed houchu measures the same text as a checkout.
"""

from __future__ import annotations

from pathlib import Path

#: the folder of the evaluation texts
DATA_DIR = Path(__file__).resolve().parent / "data"
#: the default text of the quality measurements
QUALITY_EN = DATA_DIR / "quality_en.txt"
