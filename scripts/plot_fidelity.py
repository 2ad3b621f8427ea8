"""One fidelity-vs-compute plot from the JSON records of several `blendrag bench quality` runs
of one dataset (e.g. a run over every selector and one over more ratios of one selector).

    python scripts/plot_fidelity.py runs/q25_synthetic.json runs/q25_synthetic_b.json \
        --out docs/img/answer_fidelity_synthetic.png

The first record of each (mode, selector, ratio) is kept; the plot is
``blendrag_bench.report.plot_fidelity_vs_compute``'s (same answer, answer KL, quality and
first-token KL against compute).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blendrag_bench.quality import RECORD_KEYS, ConfigSummary, QualityReport
from blendrag_bench.report import plot_fidelity_vs_compute


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="--json files of bench quality")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = p.parse_args()
    rows: dict[tuple, dict] = {}
    for path in args.records:
        for record in json.loads(path.read_text()):
            rows.setdefault((record["mode"], record["selector"], record["ratio"]), record)
    first = next(iter(rows.values()))
    summaries = [ConfigSummary(**{k: r[k] for k in RECORD_KEYS}) for r in rows.values()]
    report = QualityReport(model=first.get("model", "?"), dataset=first.get("dataset", "?"),
                           device="cpu", dtype="float32", items=first["n"], skipped=0, kinds=[],
                           metrics=[], summaries=summaries, examples=[])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_fidelity_vs_compute(report, args.out)
    print(f"wrote {args.out} ({len(summaries)} configs)")


if __name__ == "__main__":
    main()
