"""The quality texts as byte token ids: what the tiny trained models learn and are scored on."""

from __future__ import annotations

from houchu.bench.texts import DATA_DIR

DATA = DATA_DIR
EVAL = 600  #: evaluated bytes: the first 600 ASCII bytes of quality_en.txt


def ascii_ids(name: str) -> list[int]:
    """``bench/data/{name}``'s ASCII bytes below 128, as token ids."""
    return [b for b in (DATA / name).read_text().encode("ascii", "ignore") if b < 128]


EN = ascii_ids("quality_en.txt")
#: training ids: quality_en.txt past the evaluated bytes, then quality_code.txt
TRAIN = EN[EVAL:] + ascii_ids("quality_code.txt")
