"""A corpus of short passages as JSON lines ({"text": ...}): the first MuSiQue passages of the
shipped subset, distinct, each cut to its first ``--words`` words. What `blendrag calibrate`
was timed on (docs/evaluation.md).

    .venv/bin/python scripts/short_corpus.py --passages 150 --words 80 --out runs/corpus150.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blendrag_bench.datasets import load_musique


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=150)
    parser.add_argument("--words", type=int, default=80)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    seen: dict[str, None] = {}
    for item in load_musique(limit=args.passages, passages=6):
        for chunk in item.chunks:
            seen.setdefault(" ".join(chunk.split()[:args.words]), None)
    texts = list(seen)[:args.passages]
    if len(texts) < args.passages:
        raise SystemExit(f"only {len(texts)} distinct passages in the shipped subset")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    print(f"{len(texts)} passages of at most {args.words} words -> {args.out}")


if __name__ == "__main__":
    main()
