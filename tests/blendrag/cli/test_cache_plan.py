"""`blendrag cache plan`: the cheapest tier that keeps TTFT at the compute bound."""

from __future__ import annotations

import argparse
import json

import pytest

from blendrag.cli import cache as store_cli


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="blendrag")
    store_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_plan_names_the_cheapest_tier_whose_load_hides(capsys):
    # 6 x 512 tokens of Mistral-7B's KV: 12.58 MB a layer; 2 us a token-layer at 20 %:
    # (0.2 * 3072 + 64) * 2 us = 1.357 ms a layer: only RAM (0.63 ms) loads that fast
    assert _run(["cache", "plan", "--token-layer-us", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layer_bytes"] == 2 * 8 * 128 * 2 * 3072
    assert out["best"] == "ram"
    assert [t["tier"] for t in out["tiers"]] == ["s3", "disk", "redis", "ram"]
    assert [t["compute_bound"] for t in out["tiers"]] == [False, False, False, True]
    # ten times slower compute: the disk hides under it, and it is the cheapest that does
    assert _run(["cache", "plan", "--token-layer-us", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == "disk"
    # a hundred times slower (a CPU): even S3's 61 ms a layer hides under 136 ms of compute
    assert _run(["cache", "plan", "--token-layer-us", "200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == "s3"


def test_plan_says_when_no_tier_is_fast_enough(capsys):
    assert _run(["cache", "plan", "--token-layer-us", "0.1", "--tier", "nfs=0.5:500"]) == 0
    assert "no tier keeps TTFT at the compute bound" in capsys.readouterr().out
    assert _run(["cache", "plan", "--token-layer-us", "1", "--tier", "disk=fast"]) == 2
    assert "NAME=GBPS" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--token-layer-us", "nan"], ["--token-layer-us", "inf"],
                                 ["--token-layer-us", "1", "--suffix-tokens", "-100000"]])
def test_a_figure_no_prompt_has_is_refused(bad, capsys):
    assert _run(["cache", "plan", *bad]) == 2
    assert "error" in capsys.readouterr().err
