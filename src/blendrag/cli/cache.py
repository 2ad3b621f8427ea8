"""`blendrag cache stats` and `blendrag cache clear`: inspect or empty a persistent KV store
(`blendrag cache plan`, which tier a prompt shape needs, is in ``cache_plan.py``).

What a store holds, as ``stats`` explains it: *chunk* entries (with the default ingestion
context two per ingested passage: its KV computed after the chunk prefix and each filler
context, averaged, and computed after the chunk prefix alone, for a prompt's first passage)
and *prefix* entries (KVs computed after nothing: each prompt prefix, and each prefix + filler
passage, which ingestion caches once so that every chunk does not recompute them). The two are
told apart by the header of each entry file, read without loading the tensors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blendrag.cli.cache_disk import disk_stats, namespace_count
from blendrag.cli.options import (
    add_json_option,
    add_namespace_options,
    add_redis_options,
    add_store_dir_option,
    emit,
    store_keys,
)
from blendrag.store.config import StoreConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cache`` command and its ``stats``/``clear`` sub-commands."""
    cache = subparsers.add_parser(
        "cache", help="inspect or clear the persistent chunk-KV store",
        description="Inspect (stats) or empty (clear) the persistent KV store that precompute, "
                    "demo and the framework integrations write to.")
    sub = cache.add_subparsers(dest="cache_command", required=True,
                               metavar="{stats,clear,plan}")
    stats = sub.add_parser(
        "stats", help="entries (chunks, prefixes), sizes, budget and look-up counts",
        description="What the store holds: chunk and prefix entries with their tokens and "
                    "sizes, the budget, and the disk tier's lifetime look-up counts.")
    add_store_dir_option(stats)
    add_redis_options(stats)
    add_namespace_options(stats, "every namespace of the disk tier, each one's entries "
                                 "counted; the default one alone on Redis and S3")
    add_json_option(stats, "the figures")
    stats.set_defaults(func=_guarded(_stats))
    clear = sub.add_parser(
        "clear", help="delete every entry of one namespace (Redis: only keys under "
                      "--redis-prefix)",
        description="Delete every entry of the store's namespace (--namespace; the default "
                    "one unless given) and say how many entries went; other namespaces' "
                    "entries stay.")
    add_store_dir_option(clear)
    add_redis_options(clear)
    add_namespace_options(clear)
    clear.set_defaults(func=_guarded(_clear))
    from blendrag.cli import cache_plan

    cache_plan.register(sub)


def _guarded(command):
    """``command`` with its failures (an unreachable or malformed Redis URL, a damaged disk
    tier) as one ``error:`` line and exit status 2 instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            if args.redis_url is not None or args.s3_url is not None:  # StoreConfig's checks
                StoreConfig(ram_bytes=0, disk_dir=None, redis_url=args.redis_url,
                            redis_prefix=args.redis_prefix, s3_url=args.s3_url,
                            s3_endpoint_url=args.s3_endpoint)
            return command(args)
        except BrokenPipeError:  # the reader left: not the store's failure (cli.main)
            raise
        except _store_errors() as exc:
            print(f"blendrag cache {args.cache_command}: error: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 2

    return run


def _store_errors() -> tuple[type[BaseException], ...]:
    import sqlite3

    from blendrag.store.redis_tier import redis

    errors: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError, sqlite3.Error)
    if redis is not None:
        errors += (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
    try:
        import botocore.exceptions
    except ImportError:
        return errors
    return errors + (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def _store_dir(directory: Path) -> Path:
    """``directory``, refused (``NotADirectoryError``) when something other than a folder is
    there: "no store here yet" would hide that the path is wrong."""
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"--store-dir {directory} is not a folder (a KV store is a "
                                 "folder holding cache.db and the entry files)")
    return directory


def _stats(args: argparse.Namespace) -> int:
    directory = _store_dir(args.store_dir)
    names = _names(args)
    ns_id = names.ns_id
    calibrations = _calibrations(directory, names)
    disk = disk_stats(directory, ns_id, names.keys)
    if ns_id:  # its name beside its id: a stored name holds the id only
        disk["name"] = names.namespace or "the default one, with keys"
    report: dict[str, object] = {"disk": disk,
                                 "calibrations": calibrations["records"],
                                 "calibrations_refused": calibrations["refused"]}
    if args.redis_url:
        report["redis"] = {"url": args.redis_url, "prefix": args.redis_prefix,
                           "entries": _count(_redis_tier(args), ns_id=ns_id)}
    if args.s3_url:
        report["s3"] = {"url": args.s3_url, "endpoint": args.s3_endpoint,
                        "entries": _count(_s3_tier(args), ns_id=ns_id)}
    if ns_id:
        report["namespace"] = {"id": ns_id, "disk_entries": namespace_count(directory, ns_id)}
    emit(args, report, _format(report))
    return 0


def _names(args: argparse.Namespace):
    """The stored names of ``--namespace`` (keyed with ``--store-keys``)."""
    from blendrag.store.names import Names

    return Names(args.namespace, store_keys(args))


def _ns_id(args: argparse.Namespace) -> str:
    """The id of ``--namespace`` in stored names (keyed with ``--store-keys``)."""
    return _names(args).ns_id


def _calibrations(directory: Path, names) -> dict[str, list[dict]]:
    """The calibration records kept beside the store for the namespace ``names``, newest
    first, and the files refused (damaged, forged, invalid: never used, counted here)."""
    from blendrag.config import SELECTORS
    from blendrag.store.calibration import CalibrationBook

    book = CalibrationBook.beside(directory, names, SELECTORS)
    records = book.records()
    return {"records": [{"model": r.model[:12], "tokenizer": r.tokenizer[:12], **r.summary()}
                        for r in sorted(records, key=lambda r: -r.created)],
            "refused": [{"file": name, "why": why} for name, why in book.refused]}


def _s3_tier(args: argparse.Namespace):
    from blendrag.store.s3_tier import S3Tier

    return S3Tier(args.s3_url, args.s3_endpoint, read_ahead=0)


def _redis_tier(args: argparse.Namespace):
    from blendrag.store.redis_tier import RedisTier

    return RedisTier(args.redis_url, args.redis_prefix)


def _count(tier, clear: bool = False, ns_id: str = "") -> int:
    """The entries of a shared tier's namespace ``ns_id`` (a full listing), deleted too when
    ``clear``; closes it."""
    try:
        n = tier.count_entries(ns_id)
        if clear:
            tier.clear(ns_id)
        return n
    finally:
        tier.close()


def human_bytes(n: int) -> str:
    """1023 B, 4.0 KiB, 52.1 MiB, 64.0 GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


EXPLAIN = {"chunks": "per ingested passage, its rows computed after the chunk prefix and the "
                     "ingestion context's filler passages, and (with the default context) its "
                     "exact rows after the chunk prefix alone",
           "prefixes": "computed after nothing: prompt prefixes, and prefix + filler passage, "
                       "cached once for all chunks",
           "other": "unreadable, refused or foreign entries (served as misses)"}


def _format(report: dict) -> str:
    disk = report["disk"]
    lines = [f"KV store at {disk['dir']}"]
    if not disk["exists"]:
        lines.append("  no store here yet (precompute or demo creates one; --store-dir DIR "
                     "looks elsewhere)")
    else:
        lines += _disk_lines(disk)
    for c in report.get("calibrations") or ():
        lines.append(f"  calibration of model {c['model']} ({c['created']}, {c['prompts']} "
                     f"prompts of corpus {c['corpus']}): the default config runs {_chosen(c)}")
    refused = report.get("calibrations_refused") or ()
    if refused:
        lines.append(f"  {len(refused)} calibration record{'s' if len(refused) != 1 else ''} "
                     "refused (damaged, forged or invalid; never used): "
                     + "; ".join(f"{r['file']}: {r['why']}" for r in refused[:3])
                     + (" ..." if len(refused) > 3 else ""))
    if "redis" in report:
        r = report["redis"]
        lines.append(f"Redis tier at {r['url']} (keys {r['prefix']}*): {r['entries']} entries")
    if "s3" in report:
        r = report["s3"]
        where = f" at {r['endpoint']}" if r["endpoint"] else ""
        lines.append(f"S3 tier {r['url']}{where}: {r['entries']} entries")
    return "\n".join(lines)


def _disk_lines(disk: dict) -> list[str]:
    used, budget = disk["used_bytes"] or 0, disk["budget_bytes"] or 0
    share = f" ({used / budget:.1%})" if budget else ""
    if "namespace" in disk:  # one namespace's entries; the budget is the whole tier's
        whole = disk["store_used_bytes"] or 0
        lines = [f"  namespace {disk['name']} (id {disk['namespace']}): {disk['entries']} entries, "
                 f"{human_bytes(used)} (the whole store: {disk['store_entries']} entries, "
                 f"{human_bytes(whole)} of a {human_bytes(budget)} budget, index included; "
                 "Redis and S3 below: this namespace's only)"]
    else:
        lines = [f"  {disk['entries']} entries, {human_bytes(used)} of a "
                 f"{human_bytes(budget)} budget{share}, index included"]
        lines += _namespace_lines(disk["namespaces"])
    for kind, text in EXPLAIN.items():
        k = disk[kind]
        if k["entries"] or kind != "other":
            lines.append(f"    {kind:<9}{k['entries']:>6} entries {k['tokens']:>9,} tokens "
                         f"{human_bytes(k['bytes']):>11}  {text}")
    stray = disk["unreferenced"]
    if stray["files"]:
        files = f"{stray['files']} entry file{'s' if stray['files'] != 1 else ''}"
        lines.append(f"  {files} ({human_bytes(stray['bytes'])}) that no index row "
                     "references: removed when the store next opens this folder")
    lines.append(f"  look-ups since the store was created: {disk['lifetime_hits']:,} found, "
                 f"{disk['lifetime_misses']:,} not found (disk tier only, every namespace: reads "
                 "served from RAM, and precompute's checks that skip chunks already stored, are "
                 "not counted)")
    return lines


def _namespace_lines(namespaces: dict[str, int]) -> list[str]:
    """Each namespace's entries, where there is more than the default one (its id: a stored
    name holds no tenant's name)."""
    if set(namespaces) <= {""}:
        return []
    counts = ", ".join(f"{'the default one' if ns == '' else ns} {n}"
                       for ns, n in sorted(namespaces.items()))
    return [f"  in every namespace (entries): {counts}; --namespace NS counts one (with "
            "--store-keys where its entries were written with keys: they name it)"]


def _chosen(c: dict) -> str:
    """What a calibration record makes the default config run, in words."""
    if c["ratio"] is None:
        return "a full prefill (no ratio met the target)"
    if c["ratio"] >= 1.0:
        return "a full prefill (only ratio 1.0 met the target: every token recomputed)"
    if c["same_answer"] is None:  # the chosen point is not on the recorded frontier
        return f"{c['selector']} at {c['ratio']:g}"
    return (f"{c['selector']} at {c['ratio']:g}: same answer {c['same_answer']:.2f}, "
            f"answer KL {c['answer_kl']:.4f}")


def _clear(args: argparse.Namespace) -> int:
    from blendrag.store.disk import DiskTier

    ns_id = _ns_id(args)
    if (_store_dir(args.store_dir) / "cache.db").exists():
        count = namespace_count(args.store_dir, ns_id)
        tier = DiskTier(args.store_dir, budget_bytes=None)
        try:
            before = tier.usage().used_bytes or 0
            tier.clear(ns_id)
            freed = before - (tier.usage().used_bytes or 0)
        finally:
            tier.close()
        print(f"removed {count} entries ({human_bytes(max(freed, 0))}) from the KV store at "
              f"{args.store_dir}" + (f" (namespace {ns_id})" if ns_id else ""))
    else:
        print(f"nothing to remove: no KV store at {args.store_dir}")
    if args.redis_url:
        n = _count(_redis_tier(args), clear=True, ns_id=ns_id)
        print(f"removed {n} entries (keys {args.redis_prefix}*) from Redis at {args.redis_url}")
    if args.s3_url:
        n = _count(_s3_tier(args), clear=True, ns_id=ns_id)
        print(f"removed {n} entries (objects {args.s3_url}/*) from S3")
    return 0
