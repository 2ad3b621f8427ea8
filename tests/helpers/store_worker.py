"""Child-process side of the multi-process store tests:
``python -m helpers.store_worker COMMAND JSON-ARGS`` (with ``tests/`` on ``PYTHONPATH``).

Prints one JSON object on stdout. Runs with one thread: the test machines are small.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time

import torch

from blendrag.store import TieredKVStore
from blendrag.store.layered import LayerReadError
from helpers.files import open_fds
from helpers.kvgen import exact_config, make_kv, same_bits

torch.set_num_threads(1)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def read(args: dict) -> dict:
    """Read entries another process wrote; report which ones are bitwise what was expected."""
    store = TieredKVStore(exact_config(ram_bytes=0, disk_dir=args["dir"],
                                       disk_bytes=args["budget"]))
    got = {key: store.get(key) for key in args["keys"]}
    return {key: kv is not None and same_bits(kv, make_kv(seed, **args["kv"]))
            for (key, kv), seed in zip(got.items(), args["seeds"])}


def write(args: dict) -> dict:
    """Put the entries (key_i -> make_kv(seed_i)) in the given order, reading some back."""
    store = TieredKVStore(exact_config(ram_bytes=0, disk_dir=args["dir"],
                                       disk_bytes=args["budget"]))
    bad = max_used = 0
    for _ in range(args.get("rounds", 1)):
        for key, seed in zip(args["keys"], args["seeds"]):
            store.put(key, make_kv(seed, **args["kv"]))
            kv = store.get(key)
            bad += kv is not None and not same_bits(kv, make_kv(seed, **args["kv"]))
            max_used = max(max_used, store.stats().tier("disk").used_bytes)
    s = store.stats().tier("disk")
    return {"bad_reads": bad, "errors": s.errors, "corrupt": s.corrupt, "available": s.available,
            "over_budget": max_used > args["budget"]}


def readonly(args: dict) -> dict:
    """Open a store on a directory this process cannot write; requests must still succeed."""
    collect = _Collect()
    logging.getLogger("blendrag.store").addHandler(collect)
    store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=args["dir"], disk_bytes=4 << 20))
    kv = make_kv(9)
    store.put("new", kv)
    got = store.get("new")
    return {"warnings": collect.messages, "served": got is not None and same_bits(got, kv),
            "disk_available": store.stats().tier("disk").available,
            "old_entry": store.get("old") is not None}


def exhaust_descriptors(args: dict) -> dict:
    """Read the entries (key_i -> make_kv(seed_i)) with ``spare`` descriptors left under
    RLIMIT_NOFILE: first each opened layer-wise and held open, as a request holds its chunks
    (``layered``), then, with those still held, each read whole by a second store (``whole``).
    Reports what came back, whether any of it was wrong, and what each store made of it."""
    import resource

    config = exact_config(ram_bytes=0, disk_dir=args["dir"], disk_bytes=args["budget"],
                         retry_after_s=3600)
    layered, whole = TieredKVStore(config), TieredKVStore(config)
    for store in (layered, whole):
        store.contains(args["keys"][0])  # opened before the limit
    before = open_fds()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + args["spare"], hard))
    t0 = time.perf_counter()
    try:
        held = [layered.open_layers(key) for key in args["keys"]]
        got = [whole.get(key) for key in args["keys"]]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    took = time.perf_counter() - t0
    wrong = 0
    for e, seed in zip(held, args["seeds"]):
        try:
            wrong += e is not None and not same_bits(e.materialize(), make_kv(seed, **args["kv"]))
        except LayerReadError:  # the tier was benched after the entry was opened: a miss
            pass
    wrong += sum(kv is not None and not same_bits(kv, make_kv(seed, **args["kv"]))
                 for kv, seed in zip(got, args["seeds"]))
    for entry in held:
        if entry is not None:
            entry.close()
    out = {"wrong": wrong, "seconds": took, "fds_before": before, "fds_after": open_fds(),
           "layered_opened": sum(e is not None for e in held),
           "whole_read": sum(kv is not None for kv in got)}
    for name, store in (("layered", layered), ("whole", whole)):
        s = store.stats().tier("disk")
        out[name] = {"corrupt": s.corrupt, "errors": s.errors, "available": s.available}
    return out


def failed_opens(args: dict) -> dict:
    """Open a store ``n`` times on a folder this process cannot write (each disk call tries to
    open it again: ``retry_after_s=0``); the descriptors open before and after."""
    gc.disable()  # a leak must show, not be hidden by a collection that happens to run
    before = open_fds()
    for _ in range(args["n"]):
        store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=args["dir"],
                                          disk_bytes=4 << 20, retry_after_s=0))
        store.put("new", make_kv(9))
        store.get("old")
        store.close()
    gc_free = open_fds()
    gc.enable()
    gc.collect()  # what a leak would hold until the collector runs
    return {"before": before, "after": gc_free, "after_gc": open_fds(),
            "disk_errors": store.stats().tier("disk").errors}


def hang_in_write(args: dict) -> dict:
    """Put the entries, then start one more put that stops for good once its entry file is
    written and before its index row is committed (where a kill -9 leaves an orphan file):
    prints "written" then and waits to be killed."""
    from blendrag.store.disk_files import BytesOnlyDisk

    store = TieredKVStore(exact_config(ram_bytes=0, disk_dir=args["dir"],
                                       disk_bytes=args["budget"]))
    for key, seed in zip(args["keys"], args["seeds"]):
        store.put(key, make_kv(seed, **args["kv"]))
    real = BytesOnlyDisk._write

    def write_then_hang(self, full_path, iterator, mode, encoding=None):
        real(self, full_path, iterator, mode, encoding)
        print("written", flush=True)
        time.sleep(3600)

    BytesOnlyDisk._write = write_then_hang
    store.put("last", make_kv(999, **args["kv"]))
    return {}


def fingerprint(args: dict) -> dict:
    """Keys computed in this process for the model/tokenizer saved in args["model_dir"]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from blendrag.kv.keys import chunk_key, model_fingerprint, tokenizer_fingerprint

    model = AutoModelForCausalLM.from_pretrained(args["model_dir"])
    tok = AutoTokenizer.from_pretrained(args["model_dir"])
    m, t = model_fingerprint(model), tokenizer_fingerprint(tok)
    return {"model": m, "tokenizer": t, "key": chunk_key(m, t, args["prefix"], args["chunk"])}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](json.loads(sys.argv[2]))))
