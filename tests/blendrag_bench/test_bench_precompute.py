"""`blendrag bench precompute` on a few short chunks: the local job's figures, and the Ray job's
beside them on a local cluster when ray is installed."""

from __future__ import annotations

import importlib.util
import json

import pytest

from blendrag.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.mark.processes
def test_bench_precompute_reports_both_jobs_on_the_same_chunks(tmp_path, capsys):
    out = tmp_path / "precompute.json"
    argv = ["bench", "precompute", "--chunks", "6", "--chunk-tokens", "24", "--batch-size", "2",
            "--json", str(out), *(["--ray", "--actors", "1"] if HAS_RAY else [])]
    assert main(argv) == 0
    assert "local, 1 process" in capsys.readouterr().out
    records = json.loads(out.read_text())["records"]
    assert [r["job"] for r in records] == (["local", "ray"] if HAS_RAY else ["local"])
    assert all(r["chunks"] == 6 and r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in records)
    assert len({r["tokens"] for r in records}) == 1  # the same chunks, each computed once
    if HAS_RAY:
        assert records[1]["cluster_start_s"] > 0 and records[1]["startup_s"] > 0


def test_bench_precompute_refuses_bad_sizes(capsys):
    assert main(["bench", "precompute", "--chunks", "0"]) == 2
    assert "chunks must be >= 1" in capsys.readouterr().err
