"""The GPU check runs end to end (``--small``: tiny shapes, here on the CPU): every phase in a
process of its own, at most eight files, a summary with every headline figure and target."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blendrag_bench.gpu.check import PHASES


@pytest.mark.processes
def test_the_small_gpu_check_writes_its_files_and_summary(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run([sys.executable, "-m", "blendrag_bench.gpu.check", "--out", str(out),
                           "--small", "--budget", "600"], capture_output=True, text=True,
                          timeout=900, check=False,
                          # one torch thread a phase: beside the other test worker, two threads
                          # spin-waiting for a core took 154 s where one took 48
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted({"summary.md", *(file for file, _ in PHASES.values())})
    assert len(files) <= 8  # what comes back from a GPU machine
    summary = (out / "summary.md").read_text()
    for name in PHASES:
        assert f"| {name} | ok," in summary, summary
    for figure in ("3k default (preview@20%)", "16k reuse, RAM tier",
                   "RAM tier -> device", "chat turns >= 2, full+prefix-cache",
                   "chat turns >= 2, blend+prefix-cache vs its exact twin",
                   "chat, new passages, turns >= 2 vs full",
                   "decode graph vs HF generate", "disk -> device", "exactness checks failed",
                   "cold start: first request / warm, worst mode", "cold start: warm-up s",
                   "serve 4 users, default: throughput vs one at a time",
                   "serve 4 users, default: same answers as alone",
                   "decode: 4 requests' step vs one (slab)"):
        assert f"| {figure} |" in summary
    assert "| exactness checks failed | 0 | 0 | PASS |" in summary
    # 4 prompts, served twice over (--small's rounds): 4 users past their first request
    assert "| serve 4 users, full: same answers as alone | 8/8 | all | PASS |" in summary
    assert "| serve 4 users, default: p95 TTFT vs alone, after each user's first |" in summary
    assert "attention reuse, sdpa mask (us)" in summary
    for name in PHASES:  # every phase says whether it gave a fast path up (none on a CPU)
        assert f"| {name}: slower paths taken (warnings) | 0 | 0 | PASS |" in summary, summary
    ttft = (out / "ttft-3k.txt").read_text()  # the cold start, then the 3k phase
    assert ttft.index("# cold:") < ttft.index("# ttft-3k:") and "first/warm" in ttft
    exactness = (out / "exactness.txt").read_text()
    assert exactness.count("[PASS]") >= 140 and "[FAIL]" not in exactness
    assert "host reads (each a sync on a GPU):" in (out / "profile.txt").read_text()


def test_a_requests_host_reads_are_named_by_the_package_sites_that_make_them():
    import torch

    from blendrag.engine.compute.observers import LayerCounts
    from blendrag_bench.gpu.profile import sync_sites

    def request():
        counts = LayerCounts((2, 6))
        counts.count_pass(torch.arange(8), [None, 4])  # counted on the device, not read
        torch.tensor([1, 2])  # the bench's own: no site of the package's
        return counts.attended_keys  # one read back of every count

    text = sync_sites(request, cuda=False)
    lines = text.splitlines()
    assert lines[0] == "host reads (each a sync on a GPU): 1, by site (innermost frame first)"
    assert lines[1].split()[:3] == ["1", "tolist", "@"]
    assert "blendrag/engine/compute/observers.py:" in lines[1]


def test_on_cuda_the_sync_warnings_are_counted_by_site_and_other_warnings_shown(monkeypatch):
    """The CUDA path, its debug mode stood in for: torch's sync warning counted at the site that
    made it, any other warning shown as usual, the mode set before put back."""
    import os
    import warnings

    import torch

    from blendrag_bench.gpu import profile

    monkeypatch.setattr(profile, "PACKAGE", os.path.dirname(__file__) + os.sep)  # this file's
    modes = [1]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: shown.append(str(a[0])))

    def request():
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("something else", stacklevel=1)

    text = profile.sync_sites(request, cuda=True)
    lines = text.splitlines()
    assert lines[0].startswith("host syncs (torch.cuda.set_sync_debug_mode): 2,")
    assert len(lines) == 2 and lines[1].split()[0] == "2" and "test_gpu_check.py:" in lines[1]
    assert shown == ["something else"]
    assert modes == [1, "warn", 1]


def test_a_commands_output_goes_into_the_file_as_it_prints(tmp_path):
    from blendrag_bench.gpu.check import streamed

    path = tmp_path / "exactness.txt"
    script = ("import sys, time\nprint('test_a PASSED', flush=True)\n"
              "sys.stderr.write('a warning\\n')\nprint('==== 1 passed, 1 skipped in 0.1s ====')")
    with path.open("a") as f:
        f.write("# exactness: before\n")
        assert streamed([sys.executable, "-c", script], f, path) == "1 passed, 1 skipped in 0.1s"
        f.write("after\n")
    assert path.read_text().splitlines() == [
        "# exactness: before", "test_a PASSED", "a warning",
        "==== 1 passed, 1 skipped in 0.1s ====", "after"]


def test_a_command_stopped_midway_leaves_what_it_printed(tmp_path):
    from blendrag_bench.gpu.check import streamed

    path = tmp_path / "out.txt"
    script = "import os\nprint('test_a PASSED', flush=True)\nos._exit(3)"
    with path.open("a") as f:
        assert streamed([sys.executable, "-c", script], f, path) == "exit 3"
    assert path.read_text() == "test_a PASSED\n"


def test_a_warning_of_a_slower_path_is_written_and_counted():
    import logging

    from blendrag_bench.gpu.check import SLOWER_PATH_LOGGERS, _SlowerPaths

    lines: list[str] = []
    slower = _SlowerPaths(lines.append)
    loggers = [logging.getLogger(name) for name in SLOWER_PATH_LOGGERS]
    for logger in loggers:
        logger.addHandler(slower)
    try:
        logging.getLogger("blendrag.engine.compute.decode").warning("decoding without a CUDA "
                                                                     "graph (%s)", "why")
        logging.getLogger("blendrag.engine.compute.decode").info("not a slower path")
        logging.getLogger("blendrag.store").warning("another part's warning")
    finally:
        for logger in loggers:
            logger.removeHandler(slower)
    assert slower.count == 1
    assert lines == ["[warning] blendrag.engine.compute.decode: decoding without a CUDA graph "
                     "(why)"]


def test_flex_rows_never_time_the_fallback_and_a_flex_failure_stops_no_case(monkeypatch):
    """FlexAttention that cannot run (a compile error, stood in for on the CPU): the
    ``flex 2x128`` row is reported failed, not the fallback's time under flex's name; the
    other flex rows of that case and of the next are skipped, made inside the per-row
    handler; the other rows are timed."""
    import torch

    from blendrag.engine.compute import flex
    from blendrag_bench.gpu import attention

    def broken(*args, **kwargs):
        raise RuntimeError("triton: no compiler")

    monkeypatch.setattr(flex, "_FLEX", [broken])
    monkeypatch.setattr(attention, "CALLS", 1)
    n, keys = 448, 512
    pos = attention._positions(n, 0.15, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, pos.shape[0], 32, generator=g).bfloat16()  # the CUDA rows' dtype
    k, v = (torch.randn(2, keys, 32, generator=g).bfloat16() for _ in range(2))
    k[:, n:], v[:, n:] = 0, 0
    lines: list[str] = []
    out: dict = {}
    for case in ("one", "two"):
        variants = attention._variants(pos, n, keys, 32 ** -0.5, True, 2)
        attention.rows(lines.append, case, variants, q, k, v, out)
    assert lines[0].split()[:3] == ["flex", "2x128", "failed:"], lines
    assert "fell back" in lines[0] or "row blocks instead" in lines[0]
    skipped = [x.split()[:2] for x in lines if "skipped: FlexAttention is not usable" in x]
    assert skipped == [["flex", "unpadded"], ["flex", "64x64"], ["flex", "2x128"],
                       ["flex", "unpadded"], ["flex", "64x64"]]
    assert sorted(out) == ["attention one, explicit fp32 (us)", "attention one, sdpa mask (us)",
                           "attention two, explicit fp32 (us)", "attention two, sdpa mask (us)"]


def test_the_pipelined_exactness_check_pipelines(monkeypatch):
    """'pipelined == sequential' compares rows read ahead by a reader thread with rows read in
    the loop: its rows come from a tier off the request's device (an in-memory store's rows
    are resident, and a feed of resident rows never pipelines)."""
    import torch

    from blendrag.engine.compute import layer_feed
    from blendrag.engine.compute.runner import ComputeConfig
    from blendrag_bench.gpu import exactness

    feeds: list[tuple[int, bool]] = []
    made = layer_feed.LayerFeed.__init__

    def seen(self, *args, **kwargs):
        made(self, *args, **kwargs)
        feeds.append((self.depth, self.pipelined))

    monkeypatch.setattr(layer_feed.LayerFeed, "__init__", seen)
    torch.manual_seed(0)
    lines: list[str] = []
    report = exactness.Report(lines.append)
    exactness._pipelined(report, "llama", exactness._model("llama", torch.float32, "cpu"),
                         ComputeConfig())
    assert report.failed == 0 and report.passed == 1, lines
    assert lines[0].endswith("3/3 pipelined"), lines
    assert sum(pipelined for _, pipelined in feeds) == 3  # the three read ahead
    assert (0, False) in feeds  # and the sequential ones in the loop


def test_the_history_check_lets_each_turn_go_before_the_next(monkeypatch):
    """Each request of the history check runs over its engine's pooled KV buffer: a turn held
    while the next ran kept it, and the next took a buffer of its own."""
    import torch

    from blendrag.engine.compute.runner import ComputeConfig
    from blendrag_bench.gpu import exactness
    from helpers.recorders import pooled_prefills

    pooled = pooled_prefills(monkeypatch)
    report = exactness.Report(lambda line: None)
    exactness._history(report, "llama", exactness._model("llama", torch.float32, "cpu"),
                       ComputeConfig())
    assert report.failed == 0 and report.passed == 2
    assert pooled == [True] * 4
