"""Constants shared by the LlamaIndex tests (a module of its own: conftest modules of
several test folders would shadow each other on import)."""

from blendrag.config import GenerationConfig

GENERATION = GenerationConfig(max_new_tokens=8, eos_token_ids=())
QUESTION = "Where was Lionel Messi born?"


def ingest(llm, nodes, profile: bool | int = False) -> int:
    """Precompute the nodes' KVs through the LLM's client, as ``BlendKVTransform`` does; how
    many were computed now (the others were stored)."""
    return llm.client.ingest([llm.chunk_text(n) for n in nodes], profile=profile,
                             progress=False).computed


def cached(llm, nodes) -> list[bool]:
    """Whether each node's chunk KV is in the LLM's engine's store."""
    return llm.client.cached([llm.chunk_text(n) for n in nodes])
