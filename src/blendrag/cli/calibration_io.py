"""What both calibration commands (`blendrag calibrate` over passages, `--qa` over labelled
questions) read and write: the passages of ``--corpus``, the store folder the record is kept
in, the engine opened on it, the record kept and the report's last lines."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from blendrag.cli.options import engine_spec, store_keys


def check_store(args: argparse.Namespace) -> None:
    """ValueError unless ``--store-dir`` is given and its calibrations folder can be
    written."""
    if args.store_dir is None:
        raise ValueError("calibration is kept beside the store's disk tier: give --store-dir")
    folder = Path(args.store_dir) / "calibrations"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a file of its own (never a name planted there: a link would be followed), removed
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"the store folder {args.store_dir} cannot be written ({exc})") from None


def keep_record(engine, record, saved: list) -> Path | None:
    """Put ``record`` in the engine's store (the file written), end the progress ``saved``
    kept (nothing to go on from once the record is kept) and have the engine use it."""
    from blendrag.store.calibration import CalibrationBook

    path = CalibrationBook.of_store(engine.store).put(record)
    for progress in saved:
        progress.done()
    engine.use_calibration(record)
    return path


def saving(kind, engine, saved: list):
    """The ``saved=`` callback of a calibration on ``engine``: its progress of given settings
    as a ``kind`` (``SavedProgress`` or ``SavedQuestions``) beside the store's disk tier, in the
    store's namespace and signed with its keys, also appended to ``saved``."""
    from blendrag.store.names import Named, Names

    store = engine.store
    names = store.names if isinstance(store, Named) else Names()

    def keep(settings: dict):
        saved.append(kind(getattr(store, "disk_dir", None), settings, names.keys, names.ns_id))
        return saved[-1]
    return keep


@contextmanager
def opened(args: argparse.Namespace, engine=None) -> Iterator:
    """``engine``, or one loaded from the arguments on a disk store at ``--store-dir`` in
    ``--namespace``, signed with ``--store-keys`` (closed after)."""
    if engine is not None:
        yield engine
        return
    from blendrag.store import StoreConfig, TieredKVStore

    store = TieredKVStore(StoreConfig(disk_dir=args.store_dir, namespace=args.namespace,
                                      auth_key=store_keys(args),
                                      disk_bytes=_stored_budget(args.store_dir)))
    try:
        yield engine_spec(args, chat=args.chat, chunk_prefix=args.chunk_prefix).build(store)
    finally:
        store.close()


def _stored_budget(store_dir: Path) -> int:
    """The disk budget a store already has (the one a precompute gave it), else the default:
    calibrating must not change it, and a smaller default would evict valid entries when the
    store opens."""
    from blendrag.store import DiskTier, StoreConfig
    from blendrag.store.disk_files import INDEX

    if not (Path(store_dir) / INDEX).is_file():
        return StoreConfig(disk_dir=None).disk_bytes
    tier = DiskTier(store_dir, budget_bytes=None, tidy=False)
    try:
        return tier.budget_bytes
    finally:
        tier.close()


def record_dict(record) -> dict:
    from dataclasses import asdict

    return asdict(record)


def report_tail(chosen, path: Path | None) -> list[str]:
    """The report's last lines: what a chosen ratio of 1.0 runs, and where the record is."""
    lines = []
    if chosen is not None and chosen.ratio >= 1.0:
        lines.append("ratio 1.0 recomputes every token: the default config runs the exact "
                     "full prefill instead, which gives the same answers sooner")
    if path is not None:
        lines.append(f"recorded in {path}: the default BlendConfig() of an engine on this store "
                     "runs it")
    return lines


def passages(path: Path, glob: str, field: str) -> list[str]:
    """The passages of ``--corpus``: a folder's files or a JSON-lines file's field."""
    from blendrag.ingest.sources import chunks_from_folder, chunks_from_jsonl

    if path.is_dir():
        return list(chunks_from_folder(path, glob))
    if path.suffix == ".jsonl":
        return list(chunks_from_jsonl(path, field))
    if not path.exists():
        raise ValueError(f"--corpus {path} does not exist")
    raise ValueError(f"--corpus {path}: give a folder of passages or a .jsonl file")
