"""`blendrag precompute` end to end on a tiny model, and two such jobs racing on one store."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.cli import main
from blendrag.engine.caches.profile import profiled
from blendrag.ingest import chunks_from_chroma, ingest_source
from blendrag.store import TieredKVStore
from helpers import procs
from helpers.kvgen import exact_config
from helpers.sources import make_chroma
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, computed

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = [p + f"Entry {i}." for i in range(6) for p in PASSAGES]  # 24 distinct chunks


def _args(model, store_dir, *source: str) -> list[str]:
    # --kv-format model: these tests compare what is stored with rows computed here, bit for bit
    return ["precompute", "--kv-format", "model", "--model", str(model), "--device", "cpu",
            "--store-dir", str(store_dir), "--disk-bytes", "8M", "--no-chat", "--prefix", PREFIX,
            "--no-progress", "--json",
            *source]


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out)  # stdout holds the JSON alone


def test_cli_precomputes_a_jsonl_file_then_skips_it(model_dir, tmp_path, capsys):
    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"body": t}) + "\n" for t in PASSAGES))
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), "--field", "body",
                 "--text-index", str(tmp_path / "index"))
    assert main(argv) == 0
    first = _summary(capsys)
    assert (first["chunks"], first["computed"], first["skipped"]) == (4, 4, 0) and first[
        "tokens_per_s"
    ] > 0
    assert main(argv) == 0
    assert _summary(capsys)["computed"] == 0

    store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=tmp_path / "kv",
                                      disk_bytes=8 << 20))
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, store=store)
    stats = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
                           BlendConfig(ratio=0.3)).stats
    cache = stats.cache
    assert (cache.chunk_hits, cache.chunk_misses, cache.prefix_hit) == (4, 0, True)
    store.close()


def test_cli_folder_text_output_and_usage_errors(model_dir, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(PASSAGES[0])
    base = _args(model_dir("llama"), tmp_path / "kv", "--folder", str(tmp_path / "docs"))
    assert main([a for a in base if a != "--json"]) == 0
    assert "computed 1, already stored 0" in capsys.readouterr().out
    assert main(_args(model_dir("llama"), tmp_path / "kv", "--chroma-dir", str(tmp_path))) == 2
    assert "--collection" in capsys.readouterr().err
    assert main(_args(model_dir("llama"), tmp_path / "kv", "--jsonl",
                      str(tmp_path / "absent.jsonl"))) == 2
    with pytest.raises(SystemExit):
        main([*base, "--threads", "-1"])
    assert "--threads takes a count >= 0" in capsys.readouterr().err


def test_cli_profile_flag_stores_profiles_after_the_previous_line(model_dir, tmp_path, capsys):
    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), "--batch-size", "3",
                 "--profile-neighbours", "1")
    assert main(argv) == 0
    summary = _summary(capsys)
    assert (summary["computed"], summary["profiled"]) == (4, 4)
    assert main([a for a in argv if a != "--json"]) == 0  # again: nothing new to measure
    assert "computed 0" in capsys.readouterr().out

    store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=tmp_path / "kv",
                                      disk_bytes=8 << 20))
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, store=store)
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ids = [engine.prompts.encode(t) for t in PASSAGES]
    stored = [store.get(engine.key(prefix_ids, i)) for i in ids]
    for i in range(1, len(ids)):  # line 4 opens the second batch: still measured after line 3
        expected = profiled(engine.runner, stored[i], prefix_ids, [ids[i - 1]]).profile
        assert torch.allclose(stored[i].profile, expected, rtol=1e-5, atol=1e-6)
    stats = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
                           BlendConfig(selector="profile")).stats
    assert (stats.cache.chunk_hits, stats.cache.profiles_computed) == (4, 0)
    store.close()


def test_cli_profile_k_measures_after_the_k_lines_before(model_dir, tmp_path, capsys):
    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), "--batch-size", "2",
                 "--profile-neighbours", "2")
    assert main(argv) == 0
    assert _summary(capsys)["profiled"] == 4
    store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=tmp_path / "kv",
                                      disk_bytes=8 << 20))
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, store=store)
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ids = [engine.prompts.encode(t) for t in PASSAGES]
    for i in (2, 3):  # the second batch, behind lines 1-2 of the first
        stored = store.get(engine.key(prefix_ids, ids[i]))
        expected = profiled(engine.runner, stored, prefix_ids, [ids[i - 1], ids[i - 2]])
        got = store.get(engine.key(prefix_ids, ids[i])).profile
        assert torch.allclose(got, expected.profile, rtol=1e-5, atol=1e-6)
    store.close()
    bad = _args(model_dir("llama"), tmp_path / "kv2", "--jsonl", str(f), "--profile-neighbours",
                "-1")
    with pytest.raises(SystemExit):
        main(bad)
    assert "expected a count >= 0" in capsys.readouterr().err


def test_cli_text_summary_says_profiles_were_measured(model_dir, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    for i, text in enumerate(PASSAGES[:2]):
        (tmp_path / "docs" / f"{i}.txt").write_text(text)
    argv = _args(model_dir("llama"), tmp_path / "kv", "--folder", str(tmp_path / "docs"),
                 "--profile-neighbours", "1")
    assert main([a for a in argv if a != "--json"]) == 0
    assert "context-sensitivity profiles measured for 2" in capsys.readouterr().out
    plain = _args(model_dir("llama"), tmp_path / "kv2", "--folder", str(tmp_path / "docs"))
    assert main(plain) == 0 and _summary(capsys)["profiled"] == 0


@pytest.mark.processes
def test_two_processes_precomputing_one_collection_leave_a_consistent_store(model_dir, tmp_path):
    """A CLI child and this process run the same job at once, in opposite orders (they meet in the
    middle and race on the same keys)."""
    make_chroma(tmp_path / "chroma", TEXTS)
    model, kv = model_dir("llama"), tmp_path / "kv"
    store = TieredKVStore(exact_config(ram_bytes=0, disk_dir=kv, disk_bytes=8 << 20))
    engine = BlendEngine.from_pretrained(model, device="cpu", chat=False, store=store)
    source = list(chunks_from_chroma(tmp_path / "chroma", "docs"))
    argv = _args(model, kv, "--chroma-dir", str(tmp_path / "chroma"), "--collection", "docs",
                 "--batch-size", "1",
                 "--threads", "1")
    child = subprocess.Popen([sys.executable, "-m", "blendrag.cli", *argv], env=procs._env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_first_entry(store, child)
    here = ingest_source(engine, source[::-1], prefix=PREFIX, progress=False, batch_size=1)
    there = _finish(child)
    assert here.chunks == there["chunks"] == len(TEXTS)
    assert here.computed + there["computed"] >= len(TEXTS)  # each chunk computed at least once

    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    for text in TEXTS:
        ids = engine.prompts.encode(text)
        got = store.get(engine.key(prefix_ids, ids))
        ref = computed(engine, prefix_ids, ids)
        assert (
            got is not None
            and torch.equal(got.keys, ref.keys)
            and torch.equal(got.values, ref.values)
        )
    disk = store.stats().tier("disk")
    # the chunk prefix, the prefix + each filler of the ingestion context, the chunks in
    # context and each chunk computed alone (the exact rows of a first passage)
    fillers = len(engine.context.fillers)
    assert engine.context.stores_alone
    assert (disk.corrupt, disk.errors, disk.entries) == (0, 0, 1 + fillers + 2 * len(TEXTS))
    store.close()


def _wait_for_first_entry(store: TieredKVStore, proc: subprocess.Popen,
                          timeout: float = 120) -> None:
    """Until the child has stored something (its prefix KV): it is computing now."""
    deadline = time.monotonic() + timeout
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and not store.stats().tier("disk").entries
    ):
        time.sleep(0.05)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_kv_format_stores_compressed_entries_that_any_store_reads(model_dir, tmp_path, capsys):
    from helpers.files import entry_files

    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    sizes: dict[str, dict[str, int]] = {}
    for kv_format in ("model", "int8"):
        store_dir = tmp_path / kv_format
        argv = [*_args(model_dir("llama"), store_dir, "--jsonl", str(f)), "--kv-format",
                kv_format]
        assert main(argv) == 0
        assert _summary(capsys)["computed"] == len(PASSAGES)
        sizes[kv_format] = {}
        for p in entry_files(store_dir):
            data = p.read_bytes()
            meta = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])["__metadata__"]
            sizes[kv_format][meta["key"]] = len(data)
            # chunks in the asked format; the prefixes they are computed after stay exact
            prefix = not meta["prefix_hash"]  # computed after nothing
            want = "float32" if kv_format == "model" or prefix else "int8"
            assert meta["stored"] == want, meta["key"]
    chunks = [k for k in sizes["int8"] if sizes["int8"][k] < sizes["model"][k]]
    assert len(chunks) == 2 * len(PASSAGES)  # each chunk in context and alone, nothing else
    int8 = sum(sizes["int8"][k] for k in chunks)
    assert int8 < 0.4 * sum(sizes["model"][k] for k in chunks)  # small chunks: scales weigh


def test_a_keyed_precompute_signs_the_text_index_it_records(model_dir, tmp_path,
                                                           capsys):
    from blendrag.integration.text_index import ChunkTextIndex
    from blendrag.store.auth import StoreKeys
    from blendrag.store.names import Names

    keys_file = tmp_path / "keys"
    keys_file.write_text("k1=" + b"deployment-secret-0123456789".hex())
    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), "--namespace", "acme",
                 "--store-keys", str(keys_file), "--text-index", str(tmp_path / "index"))
    assert main(argv) == 0
    keys = StoreKeys.from_file(keys_file)
    signed = ChunkTextIndex(tmp_path / "index", keys=keys, namespace=Names("acme", keys).ns_id)
    assert len(signed) == len(PASSAGES)  # every row verifies under the store's keys
    other = ChunkTextIndex(tmp_path / "index", keys=keys, namespace="another-tenant-id")
    assert len(other) == 0  # bound to acme's namespace id


def test_cli_for_the_frameworks_records_texts_where_their_llms_look(model_dir, tmp_path,
                                                                     capsys):
    """``--chunk-prefix`` (chunks for the framework LLMs) without ``--text-index``: the texts
    go to the store's own text index, so an LLM opened over the store finds them in a flat
    prompt and blends, where it ran a full prefill and said to ingest through BlendKVTransform."""
    from blendrag.llamaindex import BlendLLM

    f = tmp_path / "chunks.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    argv = ["precompute", "--model", str(model_dir("llama")), "--device", "cpu", "--store-dir",
            str(tmp_path / "kv"), "--no-chat", "--chunk-prefix", "", "--no-progress", "--json",
            "--jsonl", str(f)]
    assert main(argv) == 0 and _summary(capsys)["computed"] == len(PASSAGES)
    store = TieredKVStore(exact_config(ram_bytes=1 << 20, disk_dir=tmp_path / "kv"))
    llm = BlendLLM.from_pretrained(str(model_dir("llama")), store=store, chat=False,
                                   chunk_prefix="", max_tokens=2)
    assert len(llm.text_index) == len(PASSAGES)
    response = llm.complete("Context:\n" + "\n\n".join(PASSAGES[:3]) + "\nQuery: who?\nAnswer:")
    assert response.raw["blended"] and response.raw["prompt"]["source"] == "index"
    store.close()
