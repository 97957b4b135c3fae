"""`make profile` for real: py-spy samples a running hello-world and issuer while their rounds
run, and every sample lands in a layer."""

from __future__ import annotations

import json
from pathlib import Path

from flashcoupon_loadtest.cpu_profile import LAYERS, main

from tests.support.stack import Stack


def test_profiles_hello_and_the_issuer(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = ["--paths", "hello,issuer", "--seconds", "2", "--users", "1500", "--concurrency", "16"]
    assert main([*args, "--out", str(out)]) == 0
    paths = json.loads(out.read_text())["paths"]
    assert list(paths) == ["hello", "issuer"]
    for name, figures in paths.items():
        assert figures["rounds"] >= 1 and figures["samples"] > 0, name
        assert figures["cpu_us_per_request"] > 0
        shares = [figures["layers"][layer]["share"] for layer in LAYERS]
        assert abs(sum(shares) - 1) < 0.01 and figures["layers"]["server"]["share"] > 0
    functions = [name for name, _ in paths["issuer"]["inclusive"]]
    assert any("flashcoupon_issuer/" in f for f in functions)  # the issuer's own code sampled
    assert not any("flashcoupon_issuer/" in f for f, _ in paths["hello"]["inclusive"])
