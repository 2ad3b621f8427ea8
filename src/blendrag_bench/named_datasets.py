"""The evaluation datasets by name or file: one dispatch over ``datasets`` (synthetic, MuSiQue,
CacheBlend JSON, LongBench JSONL) and ``longfacts`` (which builds on ``datasets``)."""

from __future__ import annotations

from pathlib import Path

from blendrag_bench.datasets import (
    EvalItem,
    load_cacheblend_json,
    load_longbench_jsonl,
    load_musique,
    load_synthetic,
)
from blendrag_bench.longfacts import load_longfacts

NAMED = ("synthetic", "musique", "longfacts")
"""The datasets known by name (the others are files)."""


def load_dataset(spec: str | Path, limit: int | None = None, offset: int = 0) -> list[EvalItem]:
    """``"synthetic"``, ``"musique"``, ``"longfacts"`` (``blendrag_bench.longfacts``), a
    ``.json`` file (CacheBlend format) or a ``.jsonl`` file (LongBench)."""
    if str(spec) == "synthetic":
        return load_synthetic(limit, offset)
    if str(spec) == "longfacts":
        return load_longfacts(limit, offset)
    if str(spec) == "musique":
        return load_musique(limit, offset)
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"dataset {spec!r} is neither 'synthetic', 'musique', "
                                "'longfacts' nor a file")
    if path.suffix == ".jsonl":
        return load_longbench_jsonl(path, limit, offset)
    if path.suffix == ".json":
        return load_cacheblend_json(path, limit, offset)
    raise ValueError(f"{path}: unknown dataset format (expected .json CacheBlend or .jsonl "
                     "LongBench)")


def dataset_name(spec: str | Path) -> str:
    """A short name for reports: ``synthetic``, ``musique``, ``longfacts`` or the file's stem."""
    return str(spec) if str(spec) in NAMED else Path(spec).stem
