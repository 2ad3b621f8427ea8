"""Constants shared by the LlamaIndex tests (a module of its own: conftest modules of
several test folders would shadow each other on import)."""

from blendrag.config import GenerationConfig

GENERATION = GenerationConfig(max_new_tokens=8, eos_token_ids=())
QUESTION = "Where was Lionel Messi born?"
