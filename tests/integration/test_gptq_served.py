"""``houchu serve --quantization int4 --int4-method gptq --calibration-text FILE`` on a
tiny Llama beside a tokenizer: the runner quantizes by GPTQ over the file (its start-up
line names the weights ``int4-g32-gptq``) and requests are answered."""

from __future__ import annotations

import pytest
import requests

from houchu.devtools.tiny_models import make_tiny_model, write_tiny_tokenizer
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow


def test_served_with_gptq_weights(tmp_path):
    path = make_tiny_model(tmp_path / "hf", "llama", seed=2)
    write_tiny_tokenizer(path, 128)
    text = tmp_path / "calibration.txt"
    text.write_text("Stock simmers for hours; the sauce is reduced to order. " * 40)
    srv = start_server(
        path,
        *("--quantization", "int4", "--int4-method", "gptq", "--calibration-text", str(text)),
        *("--threads", "1", "--page-size", "4", "--num-pages", "128"),
        exact=False,
    )
    try:
        assert "weights int4-g32-gptq" in srv.output()  # the runner's start-up line
        assert "GPTQ: 8 projections int4 over" in srv.output()  # its note
        r = requests.post(
            f"{srv.url}/v1/completions",
            json={"prompt": "The stock", "max_tokens": 6, "temperature": 0, "ignore_eos": True},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
    finally:
        stop_server(srv)
