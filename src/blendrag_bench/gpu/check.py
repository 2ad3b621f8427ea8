"""The project's GPU check: exactness on CUDA and every mode's speed at Mistral-7B's shape.

    make gpu-check OUT=dir        # on a GPU machine, from the project's tree, no network
    python -m blendrag_bench.gpu.check --out DIR [--small] [--budget SECONDS] [--only PHASE ...]

Each phase runs in a process of its own under a time budget (the whole check ends within
``--budget``, default 350 s, counted from the process's start: under 6 minutes; ``--budget
590``, the most one 10-minute device call allows, reaches more; on a cold machine 350 s reach
about four; the last 20 s are kept for the summary), so that a phase that fails, hangs or runs
out of time is reported and the next one still runs; partial output is kept. A check stopped
from outside (SIGTERM, SIGINT; SIGKILL too) stops its running phase. ``--small``: tiny shapes,
to check the script on a CPU. Files in DIR (eight at most: what a GPU machine sends back):

- ``summary.md``: the device, the date, the command, every headline figure against its target,
  written anew after every phase (a check stopped midway leaves one); each phase's figures are
  also in its own file, a ``[figure]`` line each, written as they are measured;
- ``exactness.txt``: tiny random models of eight families on the device against HF (every
  compute path), a disk tier to the device, then the CUDA-marked tests;
- ``ttft-3k.txt``, ``ttft-16k.txt``: ``bench ttft`` at 6 x 512 and 8 x 2,048 chunk tokens;
  ``ttft-3k.txt`` begins with the cold start: warm-up at load in a new process, then every
  mode's first request against a warm one (and the compile cache's bytes loaded);
- ``chat.txt``: ``bench chat`` (random and random-history workloads, 4 turns) at the same shape;
- ``loading.txt``: the disk tier (page cache) to the device, and pipelined TTFT from it;
- ``decode.txt``: tokens per second of eager decoding, the CUDA-graph step and HF generate;
  then ``bench serve``: 4 and 16 users through the scheduler against one request at a time,
  and one batched decoding step of 16 requests against one request's;
- ``profile.txt``: the captured passes' attention kernel against candidates, per call; then
  one request of each mode under ``torch.profiler``: top ops, launches, syncs (the default's
  host time per function too).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the budget counts from here: the process's start, imports after

import argparse  # noqa: E402 (the clock first)
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from blendrag_bench.gpu.processes import Stopped, die_with_parent, kill, stop  # noqa: E402
from blendrag_bench.gpu.summary import Figures, device_line, read_figures, render  # noqa: E402

# phase -> (its file, the most seconds it may take); in the order they run
PHASES = {
    # a new process: warm-up at load, then each mode's first request against a warm one
    # (its report opens ttft-3k.txt: a GPU machine sends back at most 8 files)
    "cold": ("ttft-3k.txt", 100),
    # the first phase pays the machine's cold start (CUDA context, Triton compiling
    # FlexAttention's kernels into its disk cache): on a cold H100, 55 s left it no row
    "ttft-3k": ("ttft-3k.txt", 100),
    "exactness": ("exactness.txt", 180),  # eight families, then the CUDA-marked tests
    "ttft-16k": ("ttft-16k.txt", 60),
    "decode": ("decode.txt", 100),  # the 7B-shaped model's build (~15 s), graph capture, HF
    # many users through the scheduler against one at a time (its report follows decoding's)
    "serve": ("decode.txt", 160),
    "chat": ("chat.txt", 120),  # two workloads: the same passages, new ones every turn
    "loading": ("loading.txt", 75),  # disk and RAM tiers to the device, then bench ttft --tier disk
    # FlexAttention and candidates per call at the captured passes' shapes: most of its time
    # compiles the kernels (about 10 s each); each case's rows are written as they are timed
    "attention": ("profile.txt", 90),
    "profile": ("profile.txt", 40),
}
# the engine's loggers whose warnings say it took a slower path than the device's fastest
SLOWER_PATH_LOGGERS = ("blendrag.engine.compute", "blendrag.serving")
# a phase is started only with at least this much of the budget left (less would not even
# build the 7B-shaped model), and the last seconds are kept for the summary
MIN_PHASE_S = 30
RESERVE_S = 20
ROOT = Path(__file__).resolve().parents[3]  # the project's tree (src/blendrag_bench/gpu/..)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the result files")
    parser.add_argument("--small", action="store_true",
                        help="tiny shapes: checks the script itself, on a CPU too")
    parser.add_argument("--budget", type=float, default=350.0,
                        help="seconds for the whole check (default: 350)")
    parser.add_argument("--only", nargs="+", choices=list(PHASES), default=None,
                        help="run only these phases (default: all)")
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase:  # one phase, in this process
        return _phase(args.phase, args.out, args.small)
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    device = device_line()  # no CUDA, no torch in this process: nvidia-smi, package metadata
    names = list(args.only or PHASES)
    status = {name: "not run yet" for name in names}
    for name in names:  # phases append to their files: start them empty
        (args.out / PHASES[name][0]).unlink(missing_ok=True)
    proc: subprocess.Popen | None = None
    code = 0
    # the check stopped from outside (a device call's time limit, `timeout`, Ctrl-C): the
    # running phase, in a session of its own, is stopped with it (it would hold the GPU on)
    handlers = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for name in names:
            file, cap = PHASES[name]
            left = args.budget - RESERVE_S - (time.perf_counter() - STARTED)
            if left < MIN_PHASE_S:
                status[name] = "not run: out of time"
                continue
            t0 = time.perf_counter()
            status[name] = "running (the check was stopped)"
            _write_summary(args, device, status)  # a check killed outright leaves this one
            # a session of its own: a phase out of time is stopped with whatever it started
            proc = subprocess.Popen(phase_command(name, args), start_new_session=True,
                                    preexec_fn=die_with_parent(os.getpid()))
            print(f"[gpu-check] {name} (at most {min(cap, left):.0f} s, pid {proc.pid})",
                  flush=True)
            try:
                status[name] = "ok" if proc.wait(timeout=min(cap, left)) == 0 else (
                    f"failed (exit {proc.returncode})")
            except subprocess.TimeoutExpired:
                kill(proc)
                status[name] = f"stopped after {min(cap, left):.0f} s (partial output kept)"
            status[name] += f", {time.perf_counter() - t0:.0f} s"
            print(f"[gpu-check] {name}: {status[name]}", flush=True)
            _write_summary(args, device, status)
    except Stopped as stopped:
        code = 128 + stopped.signum
        if proc is not None and proc.returncode is None:
            kill(proc)
            status[name] = (f"stopped: the check got {signal.Signals(stopped.signum).name} "
                            f"after {time.perf_counter() - t0:.0f} s (partial output kept)")
    finally:
        if proc is not None and proc.returncode is None:
            kill(proc)
        for s, handler in handlers.items():
            signal.signal(s, handler)
    print(_write_summary(args, device, status))
    return code


def _write_summary(args: argparse.Namespace, device: str, status: dict[str, str]) -> str:
    """``summary.md`` as things stand: each phase's status, every figure its file holds."""
    figures = read_figures(args.out / PHASES[name][0] for name in status)
    text = render(f"blendrag GPU check{' (--small)' if args.small else ''}", device,
                  f"python -m blendrag_bench.gpu.check {' '.join(sys.argv[1:])}",
                  time.perf_counter() - STARTED, status, figures)
    (args.out / "summary.md").write_text(text)
    return text


def phase_command(name: str, args: argparse.Namespace) -> list[str]:
    """The command line of one phase, run in a process of its own."""
    return [sys.executable, "-m", "blendrag_bench.gpu.check", "--phase", name,
            "--out", str(args.out)] + (
        ["--small"] if args.small else [])


def _phase(name: str, out: Path, small: bool) -> int:
    path = out / PHASES[name][0]
    with path.open("a") as f:  # two phases may share a file (cold start, ttft-3k; serve)
        def emit(line: str) -> None:
            f.write(line + "\n")
            f.flush()  # what a stopped phase wrote stays

        try:
            _run_phase(name, small, emit, f, path)
        except Exception:  # into the file: a GPU run's stderr comes back cut to its tail
            emit(f"[error] phase {name} raised:\n{traceback.format_exc()}")
            return 1
    return 0


def _run_phase(name: str, small: bool, emit: Callable[[str], None], f, path: Path) -> None:
    from blendrag_bench.gpu import attention, cold, exactness, profile, serving, shapes, speed

    emit(f"# {name}: {_device()}")
    # each figure written into the file as it is measured: a phase stopped at its time
    # limit keeps those it had
    heads = Figures(name, emit)
    slower = _SlowerPaths(emit)
    loggers = [logging.getLogger(logger) for logger in SLOWER_PATH_LOGGERS]
    for logger in loggers:
        logger.addHandler(slower)
    try:
        if name == "exactness":
            exactness.run(emit, shapes.device(), heads)
            heads["CUDA-marked tests"] = (_cuda_tests(emit, f, path), "", None)
        elif name.startswith("ttft-"):
            heads.update(speed.ttft(emit, small, name.split("-")[1]))
        elif name == "profile":
            profile.run(emit, small, heads)
        elif name == "attention":
            attention.run(emit, small, heads)
        elif name == "cold":
            cold.run(emit, small, heads)
        elif name == "serve":
            serving.serve(emit, small, heads)
        else:
            {"chat": speed.chat, "loading": speed.loading,
             "decode": speed.decode}[name](emit, small, heads)
    finally:  # its file closes with the phase
        for logger in loggers:
            logger.removeHandler(slower)
    heads[f"{name}: slower paths taken (warnings)"] = (slower.count, "0", slower.count == 0)


class _SlowerPaths(logging.Handler):
    """The warnings that say the engine gave a fast path up for a slower exact one (a kernel
    or a CUDA graph that failed, no KV slab, a compile cache not loaded or kept), each written
    into the phase's file as it comes, and counted: a phase's figures are those of the paths
    it ran, and this says which."""

    def __init__(self, write: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._write, self.count = write, 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self._write(f"[warning] {record.name}: {record.getMessage()}")


def _cuda_tests(emit, f, path: Path) -> str:
    """Run the tests marked ``cuda`` (their files found by the mark), each test's name and
    result streamed into the phase's file as it ends: a phase stopped at its time limit keeps
    what ran, and names the test that was running."""
    import torch

    if not torch.cuda.is_available():
        emit("\nCUDA-marked tests: not run (no CUDA device)")
        return "not run (no CUDA device)"
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if "mark.cuda" in p.read_text())
    emit("\nCUDA-marked tests: " + " ".join(files))
    return streamed([sys.executable, "-m", "pytest", "-v", "--tb=short", "-m", "cuda",
                     "-p", "no:cacheprovider", *files], f, path)


def streamed(command: list[str], f, path: Path) -> str:
    """Run ``command`` with its output appended to ``path`` (open as ``f``) as it prints;
    pytest's last line of counts, or the exit code."""
    f.flush()
    start = path.stat().st_size
    done = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False,
                          preexec_fn=die_with_parent(os.getpid()))
    out = path.read_bytes()[start:].decode(errors="replace")
    lines = [x for x in out.splitlines() if " passed" in x or " failed" in x]
    return lines[-1].strip(" =") if lines else f"exit {done.returncode}"


def _device() -> str:
    import platform

    import torch
    import transformers

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
    return (f"{'cuda' if torch.cuda.is_available() else 'cpu'} {name}, torch {torch.__version__},"
            f" transformers {transformers.__version__}, Python {platform.python_version()}")


if __name__ == "__main__":
    sys.exit(main())
