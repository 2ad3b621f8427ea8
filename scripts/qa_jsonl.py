"""Write a labelled bench set (synthetic, longfacts) as the question files `blendrag calibrate
--qa` reads: one JSON object a line (question, answer, passages), the items split alternately
into a calibration half and a held-out half (as `blendrag bench calibration` splits them).

    .venv/bin/python scripts/qa_jsonl.py --dataset synthetic --items 60 --out runs/qa
    # -> runs/qa/synthetic-calibrate.jsonl, runs/qa/synthetic-heldout.jsonl

The passages are the items' own (their prompt format's newline dropped) and the question is
read back from the item's suffix, so `calibrate --qa` lays them out as it lays out any
question: its instruction, the passages, the question.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blendrag_bench.datasets import EvalItem
from blendrag_bench.named_datasets import load_dataset
from blendrag_demo.prompt_format import SUFFIX_TEMPLATE

HEAD, TAIL = SUFFIX_TEMPLATE.split("{question}")


def line(item: EvalItem) -> dict:
    """One item as a question line; ValueError for an item not in the demo's prompt format."""
    if not (item.suffix.startswith(HEAD) and item.suffix.endswith(TAIL)):
        raise ValueError(f"not a demo-format suffix: {item.suffix[:60]!r}")
    question = item.suffix[len(HEAD):len(item.suffix) - len(TAIL)]
    return {"question": question, "answer": list(item.answers),
            "passages": [c.removesuffix("\n") for c in item.chunks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("synthetic", "longfacts"), default="synthetic")
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("runs/qa"))
    args = parser.parse_args()
    items = load_dataset(args.dataset, limit=args.items)
    args.out.mkdir(parents=True, exist_ok=True)
    for half, part in (("calibrate", items[0::2]), ("heldout", items[1::2])):
        path = args.out / f"{args.dataset}-{half}.jsonl"
        path.write_text("".join(json.dumps(line(item)) + "\n" for item in part))
        print(f"wrote {path} ({len(part)} questions)")


if __name__ == "__main__":
    main()
