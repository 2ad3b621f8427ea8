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


def _ttft_record(mode, selector=None, ratio=None, speedup=2.0, device_hits=0):
    return {"mode": mode, "selector": selector, "ratio": ratio, "speedup_vs_full": speedup,
            "ttft_s": 0.1 / speedup, "device_hits": device_hits}


@pytest.mark.parametrize("hits", [0, 7])
def test_the_reuse_targets_are_reported_whether_or_not_the_device_tier_hit(monkeypatch, hits):
    """Reuse from the device tier is a GPU target: without device-tier hits (no tier, or it
    held nothing) it is reported as a miss, never left out; reuse from the RAM tier is the
    reuse row itself then, or the row the bench times with the device tier set aside."""
    from blendrag_bench import ttft as bench
    from blendrag_bench.gpu import speed

    records = [_ttft_record("hf", speedup=1.0), _ttft_record("full", speedup=1.0),
               _ttft_record("prefix", speedup=1.1),
               _ttft_record("reuse", speedup=12.0, device_hits=hits),
               _ttft_record("blend", "preview", 0.2, 3.0), _ttft_record("blend", "epic", 0.15, 4.0)]
    if hits:
        records.append(_ttft_record("reuse", bench.RAM_TIER, speedup=4.0))
    monkeypatch.setattr(bench, "run", lambda w: records)
    monkeypatch.setattr(bench, "format_table", lambda records, w: "")
    out = speed.ttft(lambda line: None, small=True, prompt="3k")
    if hits:
        assert out["3k reuse, device tier"] == (12.0, ">= 10x", True)
        assert out["3k reuse, RAM tier"] == (4.0, ">= 5x", False)
    else:
        assert out["3k reuse, device tier"] == ("no device-tier hits", ">= 10x", False)
        assert out["3k reuse, RAM tier"] == (12.0, ">= 5x", True)
    assert out["3k fastest blend@15%"] == (4.0, ">= 3.5x", True)


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


def test_the_chat_blend_figure_is_the_chat_benchs_verdict(monkeypatch):
    """Blend with the prefix cache against its exact twin at turns >= 2 (chat_bench's
    verdict): not turn 1 (nothing cached yet), not any speed-up over a full prefill."""
    from blendrag_bench import chat_bench
    from blendrag_bench.gpu import speed

    def turn(config, n, speedup, vs_exact=None):
        r = {"workload": "random", "config": config, "turn": n, "speedup_vs_full": speedup,
             "ttft_s": 0.01, "full_ttft_s": 0.01 * speedup}
        return r if vs_exact is None else {**r, "vs_exact": vs_exact}

    random = ([turn("full+prefix-cache", n, 12.0 + n) for n in range(1, 5)]
              + [turn("blend+prefix-cache", 1, 0.5, 0.4)]
              + [turn("blend+prefix-cache", n, 3.0, 0.97 + n / 100) for n in range(2, 5)])
    history = [{"workload": "random-history", "turn": n, "ttft_s": 0.01,
                "without_ttft_s": 0.03, "full_ttft_s": 0.04} for n in range(1, 5)]

    def run(cfg):
        return random if cfg.workloads == ("random",) else history

    monkeypatch.setattr(chat_bench, "run", run)
    monkeypatch.setattr(chat_bench, "format_table", lambda records, cfg: "")
    out = speed.chat(lambda line: None, small=True)
    assert out["chat turns >= 2, blend+prefix-cache vs its exact twin"] == (0.99, ">= 0.95x",
                                                                           True)
    assert out["chat turns >= 2, full+prefix-cache"] == (14.0, ">= 10x", True)
    assert "chat, blend turns" not in out


def test_the_history_check_lets_each_turn_go_before_the_next(monkeypatch):
    """Each request of the history check runs over its engine's pooled KV buffer: a turn held
    while the next ran kept it, and the next took a buffer of its own."""
    import torch

    from blendrag.engine.compute.runner import ComputeConfig
    from blendrag.engine.engine import BlendEngine
    from blendrag_bench.gpu import exactness

    pooled: list[bool] = []
    prefill = BlendEngine.prefill

    def seen(self, *args, **kwargs):
        pre = prefill(self, *args, **kwargs)
        pooled.append(self.runner._pool.lent(pre.fused))
        return pre

    monkeypatch.setattr(BlendEngine, "prefill", seen)
    report = exactness.Report(lambda line: None)
    exactness._history(report, "llama", exactness._model("llama", torch.float32, "cpu"),
                       ComputeConfig())
    assert report.failed == 0 and report.passed == 2
    assert pooled == [True] * 4


@pytest.mark.parametrize("figure, value, shown", [
    ("RAM tier put, page-locked (map, register, copy) (ms)", 12.3, "12.3 ms"),
    ("serve 16 users, full: leading tokens the same as alone, median", 8.0, "8 tokens"),
    ("attention 3k reuse, sdpa mask (us)", 72.04, "72.0 us"),
    ("decode engine graph (tokens/s)", 61.25, "61.2 tokens/s"),
    ("host -> device, page-locked, one copy (GB/s)", 51.234, "51.23 GB/s"),
    ("3k full vs HF forward", -0.012, "-1.2%"),
    ("pipelined TTFT / max(load, compute), disk", 1.104, "1.10"),
    ("3k reuse, RAM tier", 6.5, "6.50x")])
def test_each_figure_is_shown_in_its_unit(figure, value, shown):
    from blendrag_bench.gpu.summary import format_value

    assert format_value(figure, value) == shown


def test_a_ttft_figure_of_a_mode_that_ran_full_says_so(monkeypatch):
    """A request the engine ran as a full prefill (``ran_full``) is no figure of its mode."""
    from blendrag_bench import ttft as bench
    from blendrag_bench.gpu import speed

    records = [_ttft_record("hf", speedup=1.0), _ttft_record("full", speedup=1.0),
               _ttft_record("prefix", speedup=1.1), _ttft_record("reuse", speedup=12.0),
               {**_ttft_record("blend", "preview", 0.2, 1.02), "ran_full": True},
               _ttft_record("blend", "epic", 0.15, 4.0)]
    monkeypatch.setattr(bench, "run", lambda w: records)
    monkeypatch.setattr(bench, "format_table", lambda records, w: "")
    out = speed.ttft(lambda line: None, small=True, prompt="3k")
    assert out["3k default (preview@20%)"] == ("1.02x (ran full)", ">= 2.5x", False)
    assert out["3k slowest mode vs full"] == ("1.02x (ran full)", ">= 0.95x", True)
    assert out["3k fastest blend@15%"] == (4.0, ">= 3.5x", True)
