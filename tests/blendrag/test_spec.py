"""EngineSpec: one picklable description from which the engine, both frameworks' LLMs, the
ingestion settings of worker jobs and the CLI build an engine."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from blendrag import BlendEngine, EngineSpec
from blendrag.distributed.settings import IngestSettings
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.spec import spec_fields
from blendrag.store import MemoryKVStore, StoreConfig


def test_a_spec_pickles_and_imports_no_torch():
    import subprocess
    import sys

    spec = EngineSpec(model="demo", dtype="bfloat16", store=StoreConfig(ram_bytes=1 << 20,
                                                                        disk_dir=None),
                      context=NO_CONTEXT, prefix_cache_bytes=1 << 20, chat=False,
                      chunk_prefix="")
    assert pickle.loads(pickle.dumps(spec)) == spec
    code = ("import sys; from blendrag.spec import EngineSpec; EngineSpec(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("field,value,message", [
    ("dtype", "float64", "EngineSpec.dtype must be one of"),
    ("threads", 0, "EngineSpec.threads must be a count"),
    ("threads", True, "EngineSpec.threads must be a count"),
    ("prefix_cache_bytes", -1, "EngineSpec.prefix_cache_bytes must be a byte count"),
    ("history_bytes", 1.5, "EngineSpec.history_bytes must be a byte count"),
    ("model", "", "EngineSpec.model must be a model name or path"),
    ("chunk_prefix", 3, "EngineSpec.chunk_prefix must be a string or None"),
])
def test_bad_values_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineSpec(**{field: value})


def test_an_open_store_is_refused_with_the_way_to_pass_it():
    with pytest.raises(ValueError, match=r"pass it to build\(store=...\)"):
        EngineSpec(store=MemoryKVStore())  # type: ignore[arg-type]


def test_build_gives_the_engine_the_spec_describes(model_dir):
    spec = EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="Docs:\n",
                      context=NO_CONTEXT, prefix_cache_bytes=1 << 20, history_bytes=0,
                      threads=None, store=StoreConfig(ram_bytes=1 << 20, disk_dir=None))
    engine = spec.build()
    assert isinstance(engine, BlendEngine) and engine.threads is None
    assert engine.prompts.chunk_prefix == "Docs:\n" and engine.prompts.chat is False
    assert engine.prefix_cache is not None and engine.history is None
    assert engine.context == NO_CONTEXT and engine.store.location() is None
    assert engine.store.stats().tiers[0].budget_bytes == 1 << 20
    store = MemoryKVStore()
    assert spec.build(store).store is store  # an open store wins over the spec's tiers


def test_ingest_settings_are_a_spec_with_a_job():
    spec = EngineSpec(model="demo", dtype="float16", chat=False, system="Be brief.",
                      context=NO_CONTEXT, threads=2, chunk_prefix="Docs:\n")
    store = StoreConfig(ram_bytes=0, disk_dir="/tmp/blendrag-spec-test")
    settings = IngestSettings.of(spec, store=store, batch_size=4)
    assert isinstance(settings, EngineSpec)
    assert {k: getattr(settings, k) for k in spec.field_values() if k != "store"} == {
        k: v for k, v in spec.field_values().items() if k != "store"}
    with pytest.raises(ValueError, match="needs chunk_prefix"):
        IngestSettings.of(spec, store=store, chunk_prefix=None)
    assert settings.store == store and settings.batch_size == 4
    with pytest.raises(ValueError, match="must outlive the workers"):
        IngestSettings.of(spec, store=StoreConfig(ram_bytes=1 << 20, disk_dir=None),
                          chunk_prefix="")


def test_spec_fields_split_engine_settings_from_an_llms():
    engine, rest = spec_fields({"dtype": "float16", "chat": False, "ratio": 0.3,
                                "max_tokens": 8})
    assert engine == {"dtype": "float16", "chat": False}
    assert rest == {"ratio": 0.3, "max_tokens": 8}


def test_both_framework_llms_build_from_one_spec(model_dir):
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from blendrag.langchain import BlendLLM as LangChainLLM
    from blendrag.llamaindex import BlendLLM as LlamaIndexLLM

    spec = EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="",
                      context=NO_CONTEXT)
    lc = LangChainLLM.from_spec(spec, ratio=0.3, max_tokens=2)
    li = LlamaIndexLLM.from_spec(spec, ratio=0.3, max_tokens=2)
    for llm in (lc, li):
        assert llm.ratio == 0.3 and llm.engine.prompts.chunk_prefix == ""
        assert llm.engine.context == NO_CONTEXT
    # from_pretrained: the engine's settings and the LLM's in one call, chunk_prefix "" default
    lc2 = LangChainLLM.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=NO_CONTEXT, max_tokens=3)
    li2 = LlamaIndexLLM.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                        context=NO_CONTEXT, max_tokens=3,
                                        prefix_cache_bytes=1 << 20)
    assert lc2.max_tokens == li2.max_tokens == 3
    assert lc2.engine.prompts.chunk_prefix == li2.engine.prompts.chunk_prefix == ""
    assert li2.engine.prefix_cache is not None
    # the same spec keys the same KVs: what one LLM stores, the other's engine finds
    text = "Rivers carry silt to the sea."
    lc.client.ingest([text])
    li3 = LlamaIndexLLM.from_spec(spec, store=lc.engine.store)
    assert li3.client.cached([text]) == [True]
    other = LlamaIndexLLM.from_spec(dataclasses.replace(spec, chunk_prefix="Q:\n"),
                                    store=lc.engine.store)
    assert other.client.cached([text]) == [False]  # another chunk prefix: other KVs
