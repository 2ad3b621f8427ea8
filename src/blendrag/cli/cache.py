"""`blendrag cache stats` and `blendrag cache clear`: inspect or empty a persistent KV store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blendrag.store.config import DEFAULT_DISK_DIR, StoreConfig
from blendrag.store.disk import DiskTier
from blendrag.store.redis_tier import RedisTier


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cache`` command and its ``stats``/``clear`` sub-commands."""
    cache = subparsers.add_parser("cache", help="inspect or clear the persistent chunk-KV store")
    sub = cache.add_subparsers(dest="cache_command", required=True)
    stats = sub.add_parser("stats", help="entries, bytes, budget and lifetime hits of the store")
    _add_location(stats)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=_guarded(_stats))
    clear = sub.add_parser("clear", help="delete every entry (Redis: only keys under the prefix)")
    _add_location(clear)
    clear.set_defaults(func=_guarded(_clear))


def _guarded(command):
    """``command`` with its failures (an unreachable or malformed Redis URL, a damaged disk
    tier) as one ``error:`` line and exit status 2 instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            if args.redis_url is not None:  # the checks StoreConfig makes
                StoreConfig(ram_bytes=0, disk_dir=None, redis_url=args.redis_url,
                            redis_prefix=args.redis_prefix)
            return command(args)
        except _store_errors() as exc:
            print(f"blendrag cache {args.cache_command}: error: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 2

    return run


def _store_errors() -> tuple[type[BaseException], ...]:
    import sqlite3

    from blendrag.store.redis_tier import redis

    errors: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError, sqlite3.Error)
    return errors + ((redis.exceptions.RedisError,) if redis is not None else ())


def _add_location(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=DEFAULT_DISK_DIR,
                   help=f"disk tier directory (default {DEFAULT_DISK_DIR})")
    p.add_argument("--redis-url", default=None, help="also the Redis tier at this URL")
    p.add_argument("--redis-prefix", default="blendrag:kv:",
                   help="namespace of the store's Redis keys")


def _stats(args: argparse.Namespace) -> int:
    report: dict[str, object] = {"disk": _disk_stats(args.dir)}
    if args.redis_url:
        tier = RedisTier(args.redis_url, args.redis_prefix)
        report["redis"] = {"url": args.redis_url, "entries": tier.count_entries()}
        tier.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, fields in report.items():
            print(name + ":")
            for k, v in fields.items():
                print(f"  {k}: {v}")
    return 0


def _disk_stats(directory: Path) -> dict[str, object]:
    if not (directory / "cache.db").exists():  # inspecting must not create a store
        return {"dir": str(directory), "exists": False}
    tier = DiskTier(directory, budget_bytes=None)
    try:
        usage = tier.usage()
        hits, misses = tier.lifetime_counts()
    finally:
        tier.close()
    return {"dir": str(directory), "exists": True, "entries": usage.entries,
            "used_bytes": usage.used_bytes,
            "budget_bytes": usage.budget_bytes, "lifetime_hits": hits, "lifetime_misses": misses}


def _clear(args: argparse.Namespace) -> int:
    if (args.dir / "cache.db").exists():
        tier = DiskTier(args.dir, budget_bytes=None)
        tier.clear()
        tier.close()
        print(f"cleared disk tier at {args.dir}")
    else:
        print(f"no disk tier at {args.dir}")
    if args.redis_url:
        tier = RedisTier(args.redis_url, args.redis_prefix)
        tier.clear()
        tier.close()
        print(f"cleared keys {args.redis_prefix}* at {args.redis_url}")
    return 0
