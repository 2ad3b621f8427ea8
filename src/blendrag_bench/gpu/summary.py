"""The GPU check's headline figures and its ``summary.md``.

A phase's figures are written into its own result file as each is measured, one line each
(``[figure] {json}``): a phase stopped at its time limit, or one that fails midway, keeps
what it measured, in the files a GPU machine sends back (eight at most: no file of their own).
The check reads them back after every phase and writes ``summary.md`` anew, so that a check
stopped at any point leaves a summary of what ran. Nothing here imports torch: the check's own
process stays light (no CUDA context beside the phases')."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

FIGURE = "[figure] "
Figure = tuple[float | str, str, bool | None]  # (value, target text, met; None: no target)
Headlines = dict[str, Figure]  # a phase's figures by name


class Figures(dict[str, Figure]):
    """A phase's headline figures, ``{name: (value, target text, met)}``; each one set is
    written through ``emit`` at once (a line of its own in the phase's file)."""

    def __init__(self, phase: str, emit: Callable[[str], None]) -> None:
        super().__init__()
        self.phase, self._emit = phase, emit

    def __setitem__(self, figure: str, value: Figure) -> None:
        if self.get(figure) == value:
            return
        super().__setitem__(figure, value)
        self._emit(FIGURE + json.dumps({"phase": self.phase, "figure": figure,
                                        "value": value[0], "target": value[1],
                                        "met": value[2]}))

    def update(self, *others, **more) -> None:
        for figure, value in dict(*others, **more).items():
            self[figure] = value


def read_figures(files: Iterable[Path]) -> dict[str, dict[str, Figure]]:
    """Every phase's figures from its file's ``[figure]`` lines (the last of a name wins)."""
    out: dict[str, dict[str, Figure]] = {}
    for path in dict.fromkeys(files):
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith(FIGURE):
                continue
            try:
                f = json.loads(line[len(FIGURE):])
            except ValueError:  # a line cut short by a phase killed as it wrote
                continue
            out.setdefault(f["phase"], {})[f["figure"]] = (f["value"], f["target"], f["met"])
    return out


def device_line() -> str:
    """The device and versions, without starting CUDA or importing torch: ``nvidia-smi``'s
    name of the GPU, the packages' versions from their metadata."""
    name = None
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=15, check=False)
            gpus = done.stdout.strip().splitlines()
            if done.returncode == 0 and gpus:
                gpu, driver = (gpus[0].split(",") + [""])[:2]
                name = f"cuda {gpu.strip()} (driver {driver.strip()}, {len(gpus)} GPU(s))"
        except (OSError, subprocess.SubprocessError):
            pass
    versions = []
    for package in ("torch", "transformers"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} not installed")
    return ", ".join([name or f"cpu {platform.processor() or platform.machine()}", *versions,
                      f"Python {platform.python_version()}"])


def render(title: str, device: str, command: str, took: float, status: dict[str, str],
           figures: dict[str, dict[str, Figure]]) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {title}", "", f"- device: {device}", f"- date: {when}; {took:.0f} s in all",
             f"- command: `{command}`", "", "| phase | status |", "|---|---|"]
    lines += [f"| {name} | {s} |" for name, s in status.items()]
    lines += ["", "| figure | value | target | met |", "|---|---|---|---|"]
    for name in status:
        for figure, (value, target, met) in figures.get(name, {}).items():
            shown = value if isinstance(value, str) else format_value(figure, value)
            verdict = "" if met is None else ("PASS" if met else "MISS")
            lines.append(f"| {figure} | {shown} | {target} | {verdict} |")
    return "\n".join(lines) + "\n"


def format_value(figure: str, value: float) -> str:
    if "vs HF forward" in figure:
        return f"{value:+.1%}"
    if "GB/s" in figure or "->" in figure:
        return f"{value:.2f} GB/s"
    if figure.endswith("(tokens/s)"):
        return f"{value:.1f} tokens/s"
    if figure.endswith("(us)"):
        return f"{value:.1f} us"
    if figure.endswith("(ms)"):
        return f"{value:.1f} ms"
    if "leading tokens" in figure:  # a count of tokens (serve: the same as alone)
        return f"{value:.0f} tokens"
    if figure.endswith(" s"):
        return f"{value:.1f} s"
    if any(word in figure for word in ("launches", "syncs", "checks", "bytes", "warnings")):
        return f"{value:.0f}"
    return f"{value:.2f}x" if "/ max" not in figure else f"{value:.2f}"
