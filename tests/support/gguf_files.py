"""A small GGUF file of a string array, float and Q4_1 tensors, written by the gguf package."""

from __future__ import annotations

import gguf
import numpy as np


def write_small_gguf(path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_string("general.name", "tiny")
    w.add_token_list([f"tok{i}" for i in range(300)])  # a string array, as vocabularies are
    w.add_token_scores([float(i) / 7 for i in range(300)])
    rng = np.random.default_rng(0)
    w.add_tensor("a", rng.normal(size=(4, 32)).astype(np.float32))
    q = gguf.quants.quantize(
        rng.normal(size=(2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1
    )
    w.add_tensor("b", q, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
