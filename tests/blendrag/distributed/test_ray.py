"""Precompute on a single-node Ray cluster on 127.0.0.1: the same entries as the local job, a
re-run computes nothing, a killed job resumed computes only the rest, a GPU shortfall is
refused at once. Skipped, saying why, without ray[data]."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time

import pytest

from blendrag import BlendEngine
from blendrag.cli import main
from blendrag.distributed import IngestSettings
from blendrag.ingest import ingest_source
from blendrag.store import StoreConfig, TieredKVStore
from helpers import procs
from helpers.kvgen import exact_config
from helpers.ray_cluster import import_ray, local_cluster
from helpers.tiny import PASSAGES, PREFIX

ray = import_ray()
from blendrag.distributed.ray import RayJob, check_cluster, precompute_texts  # noqa: E402

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("one_thread")]
# 24 distinct chunks, one without tokens, one refused (not valid Unicode)
TEXTS = [p + f"Entry {i}." for i in range(6) for p in PASSAGES] + ["", "lone \ud800 surrogate"]


@pytest.fixture(scope="module")
def cluster() -> str:
    with local_cluster(num_cpus=2) as address:
        yield address


def _redis_entries(client, prefix: str) -> dict[bytes, tuple[dict, bytes]]:
    """Every entry under ``prefix``, by key without the prefix: its parsed safetensors header
    and its tensor bytes. (The header's JSON lists the same fields in an order that varies
    from process to process, so two processes' entries are compared field by field.)"""
    ns = prefix.rstrip(":").encode() + b":"
    return {name[len(ns):]: _parts(client.get(name))
            for name in client.scan_iter(match=ns + b"*")}


def _parts(blob: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def test_ray_job_stores_what_the_local_job_stores_and_a_rerun_computes_nothing(
        cluster, model_dir, redis_server):
    def store(prefix: str) -> StoreConfig:
        # Bits are compared: K and V kept in the model's dtype (helpers.kvgen.exact_config).
        # With a lossy stored format a chunk's KV depends on whether the chunk prefix and the
        # fillers' prefixes were computed in this call or read back from the store, i.e. on
        # where the job's batches begin, which differs between the two jobs.
        return exact_config(ram_bytes=0, disk_dir=None, redis_url=redis_server.url,
                            redis_prefix=prefix)

    with TieredKVStore(store("local:")) as local_store:
        engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                             store=local_store)
        local = ingest_source(engine, TEXTS, prefix=PREFIX, progress=False)
    settings = IngestSettings(model=str(model_dir("llama")), device="cpu", chat=False,
                              chunk_prefix=None, prefix=PREFIX, store=store("ray:"), batch_size=5)
    result = precompute_texts(TEXTS, settings, RayJob(actors=2), progress=False)
    got = result.summary
    assert 0 < result.steady.startup_s < got.seconds and result.steady.computed <= 24
    assert "2 actors on 1 node(s)" in result.format()

    fields = ("chunks", "computed", "skipped", "empty", "tokens", "bytes", "refused", "failures")
    assert [getattr(got, f) for f in fields] == [getattr(local, f) for f in fields]
    assert (got.computed, got.empty, got.refused, got.failures[0].index) == (24, 1, 1, 25)
    client = redis_server.client()
    mine, theirs = _redis_entries(client, "ray:"), _redis_entries(client, "local:")
    # the chunk prefix and every chunk twice (in the ingestion context, and alone)
    assert len(mine) > 2 * 24 and mine.keys() == theirs.keys()
    assert all(mine[k] == theirs[k] for k in mine)

    # again, as LangChain Documents when it is installed: the same chunks, all stored already
    items: list = TEXTS
    if _has("langchain_core"):
        from langchain_core.documents import Document

        items = [Document(page_content=t) for t in TEXTS]
    again = precompute_texts(items, settings, RayJob(actors=2), progress=False).summary
    assert (again.computed, again.skipped, again.tokens) == (0, 24, 0)
    assert again.to_dict()["failed"] == 1 and "surrogate" in again.format()


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _cli(model, store_dir, source, *more: str) -> list[str]:
    return ["precompute", "--model", str(model), "--device", "cpu", "--no-chat",
            "--chunk-prefix", "", "--store-dir", str(store_dir), "--disk-bytes", "64M",
            "--jsonl", str(source), "--no-progress", *more]


def test_a_killed_job_resumed_computes_only_the_rest(cluster, model_dir, tmp_path):
    texts = [f"Chunk {i}: " + PASSAGES[i % 4] * 2 for i in range(160)]
    source = tmp_path / "chunks.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model, kv = model_dir("llama"), tmp_path / "kv"
    config = StoreConfig(ram_bytes=0, disk_dir=kv, disk_bytes=64 << 20)
    with TieredKVStore(config) as store:
        engine = BlendEngine.from_pretrained(model, device="cpu", chat=False, chunk_prefix="",
                                             store=store)
        keys = [engine.key(engine.prompts.chunk_prefix_ids(), engine.prompts.encode(t))
                for t in texts]
        # the CLI as a user runs it, on the test's cluster, killed once some chunks are stored
        argv = [sys.executable, "-m", "blendrag.cli",
                *_cli(model, kv, source, "--batch-size", "2", "--ray", cluster)]
        job = subprocess.Popen(argv, env=procs._env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        try:
            _wait(lambda: len(keys) - len(store.missing(keys)) >= 20 or job.poll() is not None,
                  120, "the job stored no chunk")
        finally:
            job.kill()
            job.communicate()
        # Ray stops the actors of a job whose driver died: wait until nothing more is stored
        stored = _settled(lambda: len(keys) - len(store.missing(keys)))
        missing = set(store.missing(keys))
    assert 0 < stored < len(texts), f"the job was not stopped midway ({stored} stored)"

    settings = IngestSettings(model=str(model), device="cpu", chat=False, store=config,
                              batch_size=8)
    resumed = precompute_texts(texts, settings, RayJob(actors=2), progress=False).summary
    assert (resumed.computed, resumed.skipped) == (len(missing), stored)
    expected = sum(len(engine.prompts.encode(t)) for t, k in zip(texts, keys) if k in missing)
    assert resumed.tokens == expected and resumed.complete
    with TieredKVStore(config) as store:
        assert store.missing(keys) == []


def _wait(done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05)


def _settled(count, quiet_s: float = 2.0, timeout: float = 60.0) -> int:
    """``count()`` once it has not changed for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise AssertionError("the killed job's actors kept storing chunks")
        time.sleep(0.2)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return last


def test_a_gpu_shortfall_is_refused_at_once(cluster, model_dir, tmp_path, capsys):
    settings = IngestSettings(model=str(model_dir("llama")), device="cpu", chat=False,
                              store=StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv"))
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"2 actors x 1 GPUs each need 2 GPUs, but the Ray "
                                         r"cluster has 0 \(short by 2\)"):
        precompute_texts(PASSAGES, settings, RayJob(actors=2, gpus_per_actor=1), progress=False)
    with pytest.raises(ValueError, match=r"need 3 CPUs, but the Ray cluster has 2"):
        precompute_texts(PASSAGES, settings, RayJob(actors=3), progress=False)
    assert time.monotonic() - t0 < 5  # refused before any actor starts

    source = tmp_path / "chunks.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    argv = _cli(model_dir("llama"), tmp_path / "kv", source, "--ray", cluster,
                "--gpus-per-actor", "0.5", "--actors", "2")
    assert main(argv) == 2
    assert "need 1 GPUs, but the Ray cluster has 0" in capsys.readouterr().err
    assert not (tmp_path / "kv").exists()  # refused before any store was opened


def test_a_store_folder_is_refused_on_several_nodes(cluster, monkeypatch, tmp_path):
    import blendrag.distributed.ray as ray_job

    monkeypatch.setattr(ray_job, "alive_nodes", lambda: 3)
    folder = IngestSettings(store=StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv"))
    with pytest.raises(ValueError, match="3 nodes: a store folder .* one folder per node"):
        check_cluster(folder, RayJob())
    shared = IngestSettings(store=StoreConfig(ram_bytes=0, disk_dir=None,
                                              redis_url="redis://127.0.0.1:1/0"))
    assert check_cluster(shared, RayJob()) == 3
