"""`make profile`'s reading of py-spy's samples: functions, layers, inclusive counts."""

from __future__ import annotations

import argparse

import pytest
from flashcoupon_loadtest.bench_gateway import PathSpec, chosen_paths
from flashcoupon_loadtest.cpu_profile import (
    frame_key,
    layer_of,
    main,
    report_lines,
    sampled,
    summarize,
)

_TOP = "<module> (flashcoupon-gateway:8);Runner.run (asyncio/runners.py:118)"
_CALL = "IssueFastPath.__call__ (flashcoupon_gateway/fastpath.py:{})"
RAW = "\n".join(
    [
        "<module> (flashcoupon-gateway:8);run (uvicorn/main.py:632);"
        "Runner.run (asyncio/runners.py:118) 40",
        f"{_TOP};{_CALL.format(80)};"
        "HeadWithBodyTransport.write (flashcoupon_common/httpserver.py:120) 30",
        f"{_TOP};{_CALL.format(80)};verify_hs256 (flashcoupon_gateway/auth.py:170) 20",
        f"{_TOP};{_CALL.format(81)};walk (flashcoupon_gateway/x.py:1);"
        "walk (flashcoupon_gateway/x.py:2);dumps (orjson/__init__.py:3) 10",
        "",
        "not a stack line",
    ]
)


def test_frame_key_drops_the_line_and_keeps_odd_names() -> None:
    assert frame_key("Runner.run (asyncio/runners.py:118)") == ("Runner.run", "asyncio/runners.py")
    assert frame_key("f.<locals>.<listcomp> (pkg/m.py:3)") == ("f.<locals>.<listcomp>", "pkg/m.py")
    assert frame_key("<lambda> (<string>)") == ("<lambda>", "<string>")
    assert frame_key("bare") == ("bare", "")


def test_layers_by_file() -> None:
    assert layer_of("uvicorn/protocols/http/httptools_impl.py") == "server"
    assert layer_of("asyncio/runners.py") == "server"
    assert layer_of("flashcoupon_common/httpserver.py") == "server"  # the server's own edge
    assert layer_of("flashcoupon_common/http.py") == "application"
    assert layer_of("flashcoupon_gateway/auth.py") == "application"
    assert layer_of("orjson/__init__.py") == "libraries"
    assert layer_of("<string>") == "libraries"


def test_summarize_counts_own_inclusive_and_layers() -> None:
    p = summarize(RAW)
    assert p.samples == 100
    assert p.own["Runner.run (asyncio/runners.py)"] == 40
    assert p.own["verify_hs256 (flashcoupon_gateway/auth.py)"] == 20
    # every sample passes through the loop; the two lines of __call__ are one function
    assert p.inclusive["Runner.run (asyncio/runners.py)"] == 100
    assert p.inclusive["IssueFastPath.__call__ (flashcoupon_gateway/fastpath.py)"] == 60
    # a recursive function counts once per sample, not once per frame
    assert p.inclusive["walk (flashcoupon_gateway/x.py)"] == 10
    assert p.layers == {"server": 70, "application": 20, "libraries": 10}
    assert p.share(p.layers["server"]) == 0.7


def test_summarize_of_nothing_is_empty() -> None:
    p = summarize("")
    assert p.samples == 0 and p.share(0) == 0.0 and not p.layers


def test_report_lines_give_each_layer_in_us_per_request() -> None:
    path = {
        "process": "gateway",
        "samples": 100,
        "cpu_us_per_request": 200.0,
        "layers": {
            "server": {"share": 0.7, "us_per_request": 140.0},
            "application": {"share": 0.2, "us_per_request": 40.0},
            "libraries": {"share": 0.1, "us_per_request": 20.0},
        },
        "own": [("Runner.run (asyncio/runners.py)", 0.4)],
        "inclusive": [("Runner.run (asyncio/runners.py)", 1.0)],
    }
    lines = report_lines({"gateway": path}, top=5)
    assert "140.0 us (70%)" in lines[1] and "40.0 us (20%)" in lines[1] and "200.0" in lines[1]
    assert "   40.0%  Runner.run (asyncio/runners.py)" in lines


def test_unknown_paths_and_no_seconds_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--paths", "hello,nope"])
    assert exit_info.value.code == 2
    assert "unknown paths ['nope']; choose from hello,issuer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--seconds", "0"])
    assert "--seconds must be at least 1" in capsys.readouterr().err


def test_chosen_paths_keeps_the_order_and_drops_empty_items() -> None:
    parser = argparse.ArgumentParser()
    assert chosen_paths(parser, "gateway,,hello,", ("hello", "gateway")) == ["gateway", "hello"]


def test_another_watched_process_can_be_sampled_on_a_path() -> None:
    gateway = PathSpec("gateway", "http://g", 20, "gateway", {"issuer": 10, "gateway": 20})
    assert sampled(gateway, None) is gateway and sampled(gateway, "gateway") is gateway
    issuer = sampled(gateway, "issuer")
    assert (issuer.kind, issuer.url, issuer.pid, issuer.process) == (
        "gateway",
        "http://g",
        10,
        "issuer",
    )
    with pytest.raises(ValueError, match="watches no process 'wallet' \\(gateway, issuer\\)"):
        sampled(gateway, "wallet")
