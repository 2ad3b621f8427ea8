"""BlendKVTransform in worker processes: built from settings, it rebuilds its LLM in
``IngestionPipeline(num_workers=2)``'s workers and in ``RayIngestionPipeline``'s actors, and
the querying LLM finds every chunk they stored."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.schema import TextNode

from blendrag.distributed import IngestSettings
from blendrag.llamaindex import BlendKVTransform, BlendLLM, blend_query_engine
from blendrag.store import StoreConfig, TieredKVStore
from helpers.li_data import GENERATION, QUESTION
from helpers.ray_cluster import local_cluster
from helpers.tiny import PASSAGES

TOP_K = 3
NODES = [TextNode(text=f"{p.strip()} (part {i})", id_=f"n{i}{j}")
         for i in range(2) for j, p in enumerate(PASSAGES)]


@pytest.fixture
def settings(model_dir, tmp_path) -> IngestSettings:
    return IngestSettings(model=str(model_dir("llama")), device="cpu", chat=False,
                          store=StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv"))


def _queries_find_every_chunk(settings: IngestSettings, embed) -> None:
    """A new LLM on the store the workers wrote: every retrieved chunk a hit, no fallback."""
    with TieredKVStore(settings.store) as store:
        llm = BlendLLM.from_pretrained(settings.model, device="cpu", chat=False, store=store,
                                       generation_config=GENERATION)
        assert llm.client.cached([llm.chunk_text(n) for n in NODES]) == [True] * len(NODES)
        index = VectorStoreIndex(NODES, embed_model=embed)
        # the default chunk format: the separators between the nodes are chunks too
        blend_query_engine(index, llm, similarity_top_k=TOP_K).query(QUESTION)
        cache = llm.last_stats.cache
        assert (cache.chunk_hits, cache.chunk_misses) == (2 * TOP_K - 1, 0)
        # a stock query engine's flat prompt: the texts the workers recorded find the chunks
        index.as_query_engine(llm=llm, similarity_top_k=TOP_K).query(QUESTION)
        cache = llm.last_stats.cache
        assert (cache.chunk_hits, cache.chunk_misses) == (2 * TOP_K - 1, 0)
        assert llm.fallbacks == 0


@pytest.mark.processes
def test_pipeline_workers_rebuild_the_transform_from_its_settings(settings, embed):
    transform = BlendKVTransform(settings=settings)
    out = IngestionPipeline(transformations=[transform]).run(nodes=NODES, num_workers=2)
    assert [n.id_ for n in out] == [n.id_ for n in NODES]
    assert transform._llm is None  # the workers computed, not this process
    _queries_find_every_chunk(settings, embed)


@pytest.fixture(scope="module")
def ray_cluster():
    with local_cluster(num_cpus=2) as address:
        yield address


@pytest.mark.processes
def test_ray_ingestion_pipeline_runs_the_transform_in_actors(ray_cluster, settings, embed):
    import ray

    ray_li = pytest.importorskip("llama_index.ingestion.ray",
                                 reason="llama-index-ingestion-ray is not installed")
    step = ray_li.RayTransformComponent(
        transform_class=BlendKVTransform, transform_kwargs={"settings": settings},
        map_batches_kwargs={"compute": ray.data.ActorPoolStrategy(size=2), "batch_size": 4})
    out = ray_li.RayIngestionPipeline(transformations=[step]).run(nodes=NODES)
    assert sorted(n.id_ for n in out) == sorted(n.id_ for n in NODES)
    _queries_find_every_chunk(settings, embed)


def test_a_transform_on_an_llm_copied_to_a_worker_says_how_to_fix_it(make_llm):
    copy = pickle.loads(pickle.dumps(BlendKVTransform(make_llm())))
    with pytest.raises(RuntimeError, match=r"copied into another process.*settings="):
        copy(NODES)


def test_settings_transform_is_checked_and_keyed_without_loading_a_model(settings, make_llm):
    with pytest.raises(ValueError, match="needs a BlendLLM, or settings="):
        BlendKVTransform()
    with pytest.raises(ValueError, match="an llm or settings, not both"):
        BlendKVTransform(make_llm(), settings=settings)
    with pytest.raises(ValueError, match="need a chunk_prefix"):
        BlendKVTransform(settings=IngestSettings(chunk_prefix=None, prefix="Q: ",
                                                 store=settings.store))
    a, b = BlendKVTransform(settings=settings), BlendKVTransform(settings=settings)
    assert a.kv_identity == b.kv_identity and a.persistence == b.persistence
    assert str(settings.store.disk_dir) in a.persistence
    # every persistent tier is part of the key: two buckets, two keys (the S3 tier was left out)
    s3 = dataclasses.replace(settings, store=dataclasses.replace(
        settings.store, s3_url="s3://one/kv", s3_endpoint_url="http://127.0.0.1:7480"))
    bucket = dataclasses.replace(s3, store=dataclasses.replace(s3.store, s3_url="s3://two/kv"))
    keys = {BlendKVTransform(settings=x).persistence for x in (settings, s3, bucket)}
    assert len(keys) == 3 and all(x.store.location() in k for x, k in zip(
        (settings, s3, bucket), [a.persistence, BlendKVTransform(settings=s3).persistence,
                                 BlendKVTransform(settings=bucket).persistence]))
    other = BlendKVTransform(settings=settings, chunk_template="[{text}]")
    assert other.kv_identity != a.kv_identity and other.chunk_template == "[{text}]"
    again = pickle.loads(pickle.dumps(a))
    assert (again.settings, again.kv_identity) == (settings, a.kv_identity)
