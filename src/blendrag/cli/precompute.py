"""`blendrag precompute`: ingest every chunk of a collection, folder or file (each KV computed and
stored once, ``blendrag.ingest.ingest_source``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from blendrag.cli.options import add_model_options, model_kwargs
from blendrag.store.config import DEFAULT_DISK_DIR

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``precompute`` command."""
    p = subparsers.add_parser("precompute",
                              help="precompute and store the KV of every chunk of a source",
                              description="Compute each chunk's KV once and store it (resumable: "
                                          "stored chunks are skipped).")
    _add_model(p)
    _add_store(p)
    _add_source(p)
    _add_prompt(p)
    p.add_argument("--text-index", type=Path,
                   help="also record the texts in this ChunkTextIndex directory")
    p.add_argument("--batch-size", type=int, default=32,
                   help="texts looked up in the store at once")
    p.add_argument("--profile", type=_neighbours, nargs="?", const=1, default=0, metavar="K",
                   help="also measure each new chunk's context-sensitivity profile, after the "
                        "chunk before it in "
                        "the source (--profile K: after each of the K before it), for blending "
                        "with "
                        "BlendConfig(selector='profile'); K more forwards per chunk. The source "
                        "must be in document order")
    p.add_argument("--threads", type=int,
                   help="torch CPU threads (default: torch's own, one per core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=_precompute)


def _neighbours(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--profile takes a neighbour count >= 1, got {text!r}")
    return int(text)


def _add_model(p: argparse.ArgumentParser) -> None:
    add_model_options(p)


def _add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store-dir", type=Path, default=DEFAULT_DISK_DIR,
                   help=f"disk tier directory (default {DEFAULT_DISK_DIR}, as StoreConfig)")
    p.add_argument("--disk-bytes", type=_size, default=64 << 30,
                   help="disk tier budget, e.g. 64G (default)")
    p.add_argument("--ram-bytes", type=_size, default=256 << 20,
                   help="RAM tier budget (holds the prefix KV; new entries go to disk/Redis), "
                        "default 256M")
    p.add_argument("--redis-url", default=None, help="also write to the Redis tier at this URL")
    p.add_argument("--redis-prefix", default="blendrag:kv:",
                   help="namespace of the store's Redis keys")


def _add_source(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--chroma-dir", type=Path,
                     help="a chromadb PersistentClient directory (with --collection)")
    src.add_argument("--folder", type=Path, help="one chunk per file matching --glob")
    src.add_argument("--jsonl", type=Path, help="one chunk per line: the string under --field")
    p.add_argument("--collection", help="Chroma collection name")
    p.add_argument("--glob", default="*.txt",
                   help="file pattern under --folder (default *.txt; **/*.txt recurses)")
    p.add_argument("--field", default="text",
                   help="JSONL field holding the chunk text (default text)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="leave out (with a warning naming each) JSONL lines that are not an "
                        "object with a string --field, instead of stopping at the first")


def _add_prompt(p: argparse.ArgumentParser) -> None:
    pre = p.add_mutually_exclusive_group(required=True)
    pre.add_argument("--prefix",
                     help="the prompt prefix queries will use; chunks are computed after it")
    pre.add_argument("--chunk-prefix",
                     help="the engine's canonical chunk prefix (as BlendEngine(chunk_prefix=...) "
                                            "of the framework integrations; may be empty)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap prompts in the tokenizer's chat template (default: when it has one)")
    p.add_argument("--system", default=None, help="system message of the chat template")


def _precompute(args: argparse.Namespace) -> int:
    """Exit status 0: every chunk stored; 1: the job ran but some chunks were not stored (the
    summary names them); 2: an error stopped it (one ``error:`` line)."""
    try:
        source, config = _check(args)
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        summary = _run(args, source, config)
    except (ValueError, OSError, ImportError) as exc:
        # bad input, a model that cannot be loaded, an unreadable source: no traceback
        print(f"blendrag precompute: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_dict()) if args.json else f"{source.name}\n{summary.format()}")
    if source.bad_lines:
        print(f"blendrag precompute: left out {len(source.bad_lines)} bad lines of the source:",
              file=sys.stderr)
        for bad in source.bad_lines:
            print(f"  skipped {bad}", file=sys.stderr)
    if not summary.complete:
        print(f"blendrag precompute: error: {len(summary.failures)} chunks have no stored KV"
              + (" and the text index failed" if summary.text_index_error else ""),
              file=sys.stderr)
        return 1
    return 0


def _check(args: argparse.Namespace):
    """The source and store configuration, or ValueError/FileNotFoundError/ImportError before
    the model is loaded."""
    from blendrag.store import StoreConfig

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.skip_bad_lines and args.jsonl is None:
        raise ValueError("--skip-bad-lines applies to --jsonl sources only")
    config = StoreConfig(ram_bytes=args.ram_bytes, disk_dir=args.store_dir,
                         disk_bytes=args.disk_bytes,
                         redis_url=args.redis_url, redis_prefix=args.redis_prefix)
    return _source(args), config


def _run(args: argparse.Namespace, source, config):
    from blendrag.engine.engine import BlendEngine
    from blendrag.ingest import ingest_source
    from blendrag.integration.text_index import ChunkTextIndex
    from blendrag.store import TieredKVStore

    with TieredKVStore(config) as store:
        engine = BlendEngine.from_pretrained(args.model, **model_kwargs(args), store=store,
                                             chat=args.chat,
                                             system=args.system, chunk_prefix=args.chunk_prefix)
        index = ChunkTextIndex(args.text_index) if args.text_index else None
        return ingest_source(engine, source, prefix=args.prefix, progress=not args.no_progress,
                             text_index=index, batch_size=args.batch_size, profile=args.profile)


def _source(args: argparse.Namespace):
    from blendrag.ingest.sources import chunks_from_chroma, chunks_from_folder, chunks_from_jsonl

    if args.chroma_dir is not None:
        if not args.collection:
            raise ValueError("--chroma-dir needs --collection NAME")
        return chunks_from_chroma(args.chroma_dir, args.collection)
    if args.folder is not None:
        return chunks_from_folder(args.folder, args.glob)
    return chunks_from_jsonl(args.jsonl, args.field, skip_bad_lines=args.skip_bad_lines)


def _size(text: str) -> int:
    """Bytes from ``123``, ``256M``, ``4G``, ``1.5GiB`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 256M, 4G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
