"""Child-process side of the multi-process store tests:
``python -m helpers.store_worker COMMAND JSON-ARGS`` (with ``tests/`` on ``PYTHONPATH``).

Prints one JSON object on stdout. Runs with one thread: the test machines are small.
"""

from __future__ import annotations

import json
import logging
import sys

import torch

from blendrag.store import StoreConfig, TieredKVStore
from helpers.kvgen import make_kv, same_bits

torch.set_num_threads(1)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def read(args: dict) -> dict:
    """Read entries another process wrote; report which ones are bitwise what was expected."""
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=args["dir"], disk_bytes=args["budget"]))
    got = {key: store.get(key) for key in args["keys"]}
    return {key: kv is not None and same_bits(kv, make_kv(seed, **args["kv"]))
            for (key, kv), seed in zip(got.items(), args["seeds"])}


def write(args: dict) -> dict:
    """Put the entries (key_i -> make_kv(seed_i)) in the given order, reading some back."""
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=args["dir"], disk_bytes=args["budget"]))
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
    store = TieredKVStore(StoreConfig(ram_bytes=1 << 20, disk_dir=args["dir"], disk_bytes=4 << 20))
    kv = make_kv(9)
    store.put("new", kv)
    got = store.get("new")
    return {"warnings": collect.messages, "served": got is not None and same_bits(got, kv),
            "disk_available": store.stats().tier("disk").available,
            "old_entry": store.get("old") is not None}


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
