"""Shape-only ("fake") versions of houchu's C++ CPU operators, so ``torch.compile`` can
trace through them: inside a compiled graph each runs as an opaque call, and the fake
tells the tracer its outputs' shapes and dtypes."""

from __future__ import annotations

import torch


def register_fakes(level: str) -> None:
    """Shape-only versions of ``level``'s operators, so ``torch.compile`` can trace
    through them (they run as opaque calls inside a compiled graph)."""
    lib = f"houchu_cpu_{level}::"
    reg = torch.library.register_fake

    reg(lib + "rms_norm")(lambda x, w, eps: x.new_empty(x.shape))
    reg(lib + "add_rms_norm")(lambda x, d, w, eps: (x.new_empty(x.shape), x.new_empty(x.shape)))
    reg(lib + "rope")(lambda q, k, cos, sin: (q.new_empty(q.shape), k.new_empty(k.shape)))
    reg(lib + "silu_mul")(lambda g: g.new_empty(g.shape[0], g.shape[1] // 2))
    reg(lib + "paged_decode_attention")(lambda q, *rest: q.new_empty(q.shape))
    reg(lib + "prefill_attention")(lambda q, k, v, start, scale, window=0: q.new_empty(q.shape))
    reg(lib + "int4_gemv")(
        lambda x, packed, g, n, int8_acts=False, batch_invariant=False, float_out=False: (
            x.new_empty(x.shape[0], n, dtype=torch.float32 if float_out else x.dtype)
        )
    )
    reg(lib + "int8_gemv")(
        lambda x, packed, n, float_out=False: x.new_empty(
            x.shape[0], n, dtype=torch.float32 if float_out else x.dtype
        )
    )
    reg(lib + "decode_layers")(_decode_layers_fake)
    reg(lib + "argmax_rows")(lambda x: x.new_empty(x.shape[0], dtype=torch.int64))
    reg(lib + "col_absmax")(lambda x: x.new_empty(x.shape[1], dtype=torch.float32))
    reg(lib + "quantize_rows_int8")(
        lambda x, cols: (
            x.new_empty(x.shape, dtype=torch.int8),
            x.new_empty(x.shape[0], 1, dtype=torch.float32),
            x.new_empty(x.shape[0], cols.shape[0]),
        )
    )
    reg(lib + "int8_epilogue")(
        lambda acc, xs, ws, outliers, w, cols, silu_mul=False: acc.new_empty(
            acc.shape[0], acc.shape[1] // 2 if silu_mul else acc.shape[1], dtype=outliers.dtype
        )
    )


def _decode_layers_fake(  # noqa: PLR0913 (the operator's schema)
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norms: list[torch.Tensor],
    eps: float,
    linears: list[torch.Tensor],
    group_sizes: list[int],
    out_features: list[int],
    act_dtype: torch.dtype,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    final_norm: torch.Tensor | None = None,
    lm_head: torch.Tensor | None = None,
    head_group_size: int = 0,
    vocab_size: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    int8_acts: bool = False,
    batch_invariant: bool = False,
) -> torch.Tensor:
    if lm_head is None:
        return x.new_empty(x.shape)
    return x.new_empty(x.shape[0], vocab_size, dtype=torch.float32)
