"""`blendrag precompute`: ingest every chunk of a collection, folder or file (each KV computed and
stored once, ``blendrag.ingest.ingest_source``), in this process or on Ray actors (``--ray``,
``precompute_ray.py``)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from blendrag.cli.options import (
    add_chat_option,
    add_json_option,
    add_model_options,
    add_namespace_options,
    add_profile_neighbours_option,
    add_progress_option,
    add_redis_options,
    add_store_dir_option,
    apply_threads,
    emit,
    engine_spec,
    store_keys,
)
from blendrag.cli.precompute_ray import add_ray_options, check_ray_args, run_ray
from blendrag.store.config import KV_FORMATS, StoreConfig

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``precompute`` command."""
    p = subparsers.add_parser(
        "precompute", help="compute and store the KV of every chunk of a source, once",
        description="Compute each chunk's KV once and store it in the persistent KV store "
                    "(resumable: chunks already stored are skipped). Queries then blend the "
                    "stored KVs instead of prefilling the chunks.")
    add_model_options(p)
    _add_store(p)
    _add_source(p)
    _add_prompt(p)
    p.add_argument("--text-index", type=Path, metavar="DIR",
                   help="also record the texts in this ChunkTextIndex directory, for flat "
                        "prompts to find them (default: with --chunk-prefix, the store's own "
                        "<store-dir>/text_index, where the framework LLMs look; else none)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="texts looked up in the store at once (default: 32)")
    add_profile_neighbours_option(
        p, default=0,
        what="also measure each new chunk's context-sensitivity profile after each of the K "
             "chunks before it in the source, for BlendConfig(selector='profile'); K more "
             "forwards per chunk; the source must be in document order; 0: no profiles")
    p.add_argument("--calibrate", action="store_true",
                   help="then calibrate on the ingested passages (blendrag calibrate's defaults: "
                        "24 prompts, same answer >= 0.9 and answer KL <= 0.02 over 32 tokens) "
                        "and keep the record in the store (default: no)")
    add_progress_option(p)
    add_json_option(p, "the summary")
    add_ray_options(p)
    p.set_defaults(func=_precompute)


def _add_store(p: argparse.ArgumentParser) -> None:
    add_store_dir_option(p)
    p.add_argument("--disk-bytes", type=_size, default=64 << 30, metavar="SIZE",
                   help="disk tier budget, e.g. 64G (default: 64G)")
    p.add_argument("--ram-bytes", type=_size, default=256 << 20, metavar="SIZE",
                   help="RAM tier budget (holds the prefix KV; new entries go to disk/Redis) "
                        "(default: 256M)")
    add_redis_options(p)
    add_namespace_options(p)
    p.add_argument("--kv-format", choices=KV_FORMATS, default=StoreConfig.kv_format,
                   help="how the disk and Redis tiers store K and V: the model's dtype (model, "
                        "exact), bfloat16, float16 or int8, decoded as read (default: "
                        f"{StoreConfig.kv_format})")


def _add_source(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--chroma-dir", type=Path,
                     help="a chromadb PersistentClient directory (with --collection)")
    src.add_argument("--folder", type=Path, help="one chunk per file matching --glob")
    src.add_argument("--jsonl", type=Path, help="one chunk per line: the string under --field")
    p.add_argument("--collection", help="Chroma collection name (with --chroma-dir)")
    p.add_argument("--glob", default="*.txt",
                   help="file pattern under --folder; **/*.txt recurses (default: *.txt)")
    p.add_argument("--field", default="text",
                   help="JSONL field holding the chunk text (default: text)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first unreadable file of --folder (not text in UTF-8, "
                        "no permission) or bad line of --jsonl (not an object with a string "
                        "--field) (default: leave each out, with a warning naming it and a "
                        "count)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="the default; kept for scripts written when it was not")


def _add_prompt(p: argparse.ArgumentParser) -> None:
    pre = p.add_mutually_exclusive_group(required=True)
    pre.add_argument("--prefix",
                     help="the prompt prefix queries will use; chunks are computed after it "
                          "(this or --chunk-prefix is required)")
    pre.add_argument("--chunk-prefix",
                     help="the engine's canonical chunk prefix, as BlendEngine(chunk_prefix=...) "
                          "of the framework integrations; may be \"\"")
    add_chat_option(p)
    p.add_argument("--system", default=None,
                   help="system message of the chat template (default: none)")


def _precompute(args: argparse.Namespace) -> int:
    """Exit status 0: every chunk stored; 1: the job ran but some chunks were not stored, or
    some files or lines of the source could not be read (the summary names them, ``--json``
    under ``unreadable``); 2: an error stopped it, or the source had nothing at all to ingest
    (one ``error:`` line)."""
    try:
        source, config = _check(args)
        apply_threads(args)
        if args.ray is not None:
            result = run_ray(args, source, config)
            summary, payload, text = result.summary, result.to_dict(), result.format()
        else:
            summary = _run(args, source, config)
            payload, text = summary.to_dict(), summary.format()
    except (ValueError, OSError, ImportError) as exc:
        # bad input, a model that cannot be loaded, an unreadable source, a Ray cluster that
        # cannot run the job: no traceback
        print(f"blendrag precompute: error: {exc}", file=sys.stderr)
        return 2
    what = "files" if args.folder is not None else "lines"
    if source.bad_lines:  # in the results too: a script reading them must not miss them
        payload = {**payload, "unreadable": [str(bad) for bad in source.bad_lines]}
        text += f"\nunreadable {what} left out: {len(source.bad_lines)}"
    emit(args, payload, f"{source.name}\n{text}")
    if source.bad_lines:
        print(f"blendrag precompute: warning: skipped {len(source.bad_lines)} unreadable "
              f"{what} of {source.name} (--strict stops at the first):", file=sys.stderr)
        for bad in source.bad_lines:
            print(f"  skipped {bad}", file=sys.stderr)
    if summary.nothing is not None:
        print(f"blendrag precompute: error: {source.name}: {summary.nothing}", file=sys.stderr)
        return 2
    if not summary.complete:
        print(f"blendrag precompute: error: {len(summary.failures)} chunks have no stored KV"
              + (" and the text index failed" if summary.text_index_error else ""),
              file=sys.stderr)
        return 1
    return 1 if source.bad_lines else 0


def _check(args: argparse.Namespace):
    """The source and store configuration, or ValueError/FileNotFoundError/ImportError before
    the model is loaded."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.skip_bad_lines and args.strict:
        raise ValueError("--skip-bad-lines and --strict contradict each other: give one")
    check_ray_args(args)
    if args.calibrate and args.ray is not None:
        raise ValueError("--calibrate runs in this process: leave out --ray, or calibrate "
                         "afterwards with `blendrag calibrate`")
    source = _source(args)
    if args.calibrate:  # before the job: too few passages would stop it after every chunk
        from blendrag.calibration.prompts import check_corpus

        check_corpus(list(source))
    config = StoreConfig(ram_bytes=args.ram_bytes, disk_dir=args.store_dir,
                         disk_bytes=args.disk_bytes,
                         redis_url=args.redis_url, redis_prefix=args.redis_prefix,
                         s3_url=args.s3_url, s3_endpoint_url=args.s3_endpoint,
                         kv_format=args.kv_format, namespace=args.namespace,
                         auth_key=store_keys(args))
    return source, config


def _run(args: argparse.Namespace, source, config):
    from blendrag.ingest import ingest_source
    from blendrag.integration.text_index import index_for_store
    from blendrag.store import TieredKVStore

    with TieredKVStore(config) as store:
        engine = engine_spec(args, chat=args.chat, system=args.system,
                             chunk_prefix=args.chunk_prefix).build(store)
        index = (index_for_store(args.text_index, config) if args.text_index
                 else _framework_index(args, engine))
        summary = ingest_source(engine, source, prefix=args.prefix,
                                progress=not args.no_progress, text_index=index,
                                batch_size=args.batch_size, profile=args.profile_neighbours)
        if args.calibrate and summary.nothing is None:
            _calibrate(args, engine, list(source))
        return summary


def _framework_index(args: argparse.Namespace, engine):
    """Without --text-index: chunks for the framework LLMs (--chunk-prefix) have their texts
    recorded where those LLMs look over this store (``default_text_index``: the disk tier's
    folder, per namespace); None without a disk tier or for the engine's own prompts."""
    from blendrag.integration.default_index import default_text_index

    if args.chunk_prefix is None or engine.store.disk_dir is None:
        return None
    return default_text_index(engine)


def _calibrate(args: argparse.Namespace, engine, texts: list[str]) -> None:
    """``blendrag calibrate`` over the passages just ingested, as the prompts were described:
    the integration's flow with --chunk-prefix, the engine's after --prefix."""
    from blendrag.calibration.run import calibrate
    from blendrag.cli.calibrate import DEFAULT_BUDGET_S, report
    from blendrag.cli.progress import Progress
    from blendrag.store.calibration import CalibrationBook

    flow = "integration" if args.chunk_prefix is not None else "engine"
    extra = {"instruction": args.prefix} if args.prefix else {}
    record = calibrate(engine, texts, flow=flow, budget_s=DEFAULT_BUDGET_S,
                       on_prompt=Progress("calibrating", unit="prompts",
                                          enabled=not args.no_progress), **extra)
    path = CalibrationBook.of_store(engine.store).put(record)  # signed, in its namespace
    print(report(record, path, "the ingested passages", len(texts)), file=sys.stderr)
    if path is None:
        print("blendrag precompute: the calibration is not kept: the store has no disk tier "
              "(--store-dir)", file=sys.stderr)


def _source(args: argparse.Namespace):
    from blendrag.ingest.sources import chunks_from_chroma, chunks_from_folder, chunks_from_jsonl

    if args.chroma_dir is not None:
        if not args.collection:
            raise ValueError("--chroma-dir needs --collection NAME")
        return chunks_from_chroma(args.chroma_dir, args.collection)
    if args.folder is not None:
        return chunks_from_folder(args.folder, args.glob, skip_bad_files=not args.strict)
    return chunks_from_jsonl(args.jsonl, args.field, skip_bad_lines=not args.strict)


def _size(text: str) -> int:
    """Bytes from ``123``, ``256M``, ``4G``, ``1.5GiB`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 256M, 4G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
