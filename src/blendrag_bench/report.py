"""Quality-benchmark outputs: Markdown table, CSV, JSON records and the quality-vs-TTFT plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from blendrag_bench.quality import ConfigSummary, QualityReport

TABLE_MD, TABLE_CSV, PLOT_PNG = "table.md", "table.csv", "quality_vs_ttft.png"
COMPUTE_PNG = "fidelity_vs_compute.png"
CSV_COLUMNS = ("mode", "selector", "ratio", "same_answer", "answer_kl", "quality", "exact_match",
               "first_token_agreement", "kl", "ttft_s", "speedup_vs_full", "recompute_fraction",
               "compute_fraction", "n")


def _fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _neighbour_words(report: QualityReport) -> str:
    k = report.profile_neighbours
    what = "predecessor" if k == 1 else f"{k} predecessors (largest deviation kept)"
    order = "prompt order" if report.ingest_order == "prompt" else "a shuffled order"
    return f"{what} in {order}"


def _quality(report: QualityReport) -> str:
    """The quality column's heading: the metric it is the mean of."""
    if not report.metrics:
        return "quality"
    return "quality (" + " / ".join(_METRIC_NAMES.get(m, m) for m in report.metrics) + ")"


def _score(value: float) -> str:
    """A mean score; "-" for items without gold answers (NaN)."""
    return "-" if math.isnan(value) else f"{value:.3f}"


def format_markdown(report: QualityReport) -> str:
    """A heading line, the per-config table and (with several kinds) quality per kind."""
    lines = [f"Quality vs TTFT: model `{report.model}` ({report.dtype} on {report.device}), "
             "dataset "
             f"`{report.dataset}`, {report.items} items" + (f" ({report.skipped} skipped: too long)"
                                                             if report.skipped else "")
             + ("; context profiles measured after each chunk's "
                + _neighbour_words(report)
                if any(s.selector == "profile" for s in report.summaries) else ""),
             *([f"Ran: {report.flow}"] if report.flow else []),
             "",
             f"| mode | selector | ratio | same answer as full | answer KL | {_quality(report)} "
             "| EM | first-token agreement | first-token KL | TTFT ms | speedup | recompute | "
             "compute |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report.summaries:
        lines.append(f"| {s.mode} | {s.selector or '-'} | {_fmt_ratio(s.ratio)} "
                     f"| {s.same_answer:.3f} | {s.answer_kl:.4f} | {_score(s.quality)} "
                     f"| {_score(s.exact_match)} | {s.first_token_agreement:.3f} | {s.kl:.4f} | "
                     f"{s.ttft_s * 1e3:.1f} | "
                     f"{s.speedup_vs_full:.2f}x | {s.recompute_fraction:.3f} | "
                     f"{s.compute_fraction:.3f} |")
    if len(report.kinds) > 1:
        lines += ["", "Quality per kind:", "", "| config | " + " | ".join(report.kinds) + " |",
                  "|---|" + "---:|" * len(report.kinds)]
        for s in report.summaries:
            cells = " | ".join(f"{s.quality_by_kind[k]:.3f}" if k in s.quality_by_kind else "-"
                               for k in report.kinds)
            lines.append(f"| {s.label} | {cells} |")
    return "\n".join(lines)


def records(report: QualityReport) -> list[dict]:
    """One JSON record per config with exactly the keys of
    ``blendrag_bench.quality.RECORD_KEYS``."""
    return [s.record() for s in report.summaries]


def write_json(report: QualityReport, path: Path) -> None:
    """``records(report)`` as a JSON list."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records(report), indent=2))


def write_csv(report: QualityReport, path: Path) -> None:
    """The per-config table, with a ``quality_<kind>`` column per kind when there are several."""
    extra = [f"quality_{k}" for k in report.kinds] if len(report.kinds) > 1 else []
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(CSV_COLUMNS) + extra)
        for s in report.summaries:
            row = ["" if getattr(s, c) is None else getattr(s, c) for c in CSV_COLUMNS]
            writer.writerow(
                row + [s.quality_by_kind.get(k, "") for k in report.kinds] if extra else row
            )


_METRIC_NAMES = {"qa_f1": "QA F1", "rouge_l": "ROUGE-L"}
_BASELINES = {"full": ("*", "black", "full prefill"), "prefix": ("s", "tab:gray", "prefix caching"),
              "reuse": ("X", "tab:red", "full KV reuse")}


def _series(summaries: list[ConfigSummary]) -> dict[str, list[ConfigSummary]]:
    out: dict[str, list[ConfigSummary]] = {}
    for s in summaries:
        if s.selector is not None:
            out.setdefault(s.selector, []).append(s)
    return {k: sorted(v, key=lambda s: s.ratio or 0.0) for k, v in out.items()}


def plot_quality_vs_ttft(report: QualityReport, path: Path) -> None:
    """Quality against median TTFT: one line per blend selector over its ratios (labelled),
    one marker each for full prefill, prefix caching and full KV reuse."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for selector, rows in _series(report.summaries).items():
        xs, ys = [s.ttft_s * 1e3 for s in rows], [s.quality for s in rows]
        ax.plot(xs, ys, marker="o", label=f"blend ({selector})")
        for s, x, y in zip(rows, xs, ys):
            ax.annotate(f"{s.ratio:.0%}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    for s in report.summaries:
        if s.mode in _BASELINES:
            marker, color, label = _BASELINES[s.mode]
            ax.scatter([s.ttft_s * 1e3], [s.quality], marker=marker, s=110, color=color,
                       label=label, zorder=3)
    ax.set_xlabel("TTFT, median over items (ms)")
    ax.set_ylabel(
        "quality (mean " + " / ".join(_METRIC_NAMES.get(m, m) for m in report.metrics) + ")"
    )
    ax.set_title(f"{_short(report.model)} on {report.dataset} ({report.items} items, "
                 f"{report.device})", fontsize=10)
    _pad_limits(ax, [s.quality for s in report.summaries])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)


def plot_fidelity_vs_compute(report: QualityReport, path: Path) -> None:
    """Same answer as full, answer KL, answer quality and first-token KL against the compute
    spent (every computed token-layer, preview passes included, over full prefill's): one line
    per blend selector, markers for the baselines. The fidelity frontier of
    docs/benchmarks.md."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    panels = fig.subplots(1, 4)
    metrics = (("same_answer", "same answer as full prefill"),
               ("answer_kl", "answer KL(full || mode), log scale"),
               ("quality", "answer quality"), ("kl", "first-token KL, log scale"))
    for ax, (attr, label) in zip(panels, metrics):
        for selector, rows in _series(report.summaries).items():
            ax.plot([s.compute_fraction for s in rows], [getattr(s, attr) for s in rows],
                    marker="o", label=f"blend ({selector})")
        for s in report.summaries:
            # prefix caching is exact: KL ~1e-11 would only stretch the log axis
            if (s.mode in _BASELINES and s.mode != "full"
                    and not (attr in _LOG and getattr(s, attr) < 1e-6)):
                marker, color, name = _BASELINES[s.mode]
                ax.scatter([s.compute_fraction], [getattr(s, attr)], marker=marker, s=90,
                           color=color, label=name, zorder=3)
        if attr in _LOG:
            ax.set_yscale("log")
            ax.set_ylim(bottom=1e-4)  # an exact config (KL ~1e-11) would stretch the axis
            ax.axhline(0.02, color="black", linestyle=":", linewidth=1)
        ax.set_xlabel("compute / full prefill's")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    panels[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{_short(report.model)} on {report.dataset} ({report.items} items)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


_LOG = ("answer_kl", "kl")


def _short(model: str) -> str:
    """A local model directory by its name; hub ids as they are."""
    path = Path(model)
    return path.name if path.is_dir() else model


def _pad_limits(ax, qualities: list[float]) -> None:
    lo, hi = min(qualities), max(qualities)
    pad = max(0.05, (hi - lo) * 0.1)
    ax.set_ylim(max(-0.02, lo - pad), min(1.02, hi + pad))
    ax.set_xlim(left=0)


def write_report(
    report: QualityReport, out_dir: Path, json_path: Path | None = None
) -> dict[str, Path]:
    """Write table.md, table.csv, quality_vs_ttft.png, fidelity_vs_compute.png into ``out_dir``
    (and the JSON records to ``json_path``); returns the paths by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / TABLE_MD, "csv": out_dir / TABLE_CSV, "png": out_dir / PLOT_PNG,
             "compute_png": out_dir / COMPUTE_PNG}
    paths["md"].write_text(format_markdown(report) + "\n")
    write_csv(report, paths["csv"])
    plot_quality_vs_ttft(report, paths["png"])
    plot_fidelity_vs_compute(report, paths["compute_png"])
    if json_path is not None:
        write_json(report, json_path)
        paths["json"] = json_path
    return paths
