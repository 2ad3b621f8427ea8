from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

from tiny import build_config, build_tokenizer, save_model  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer_dir):
    """factory(family, **config kwargs) -> directory with model + tokenizer, built once per args."""
    import shutil

    made: dict[tuple, Path] = {}

    def make(family: str = "llama", **kw) -> Path:
        key = (family, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}")
            save_model(build_config(family, **kw), path)
            for f in tokenizer_dir.iterdir():
                shutil.copy(f, path / f.name)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="session")
def engine_for(model_dir):
    """factory(family, dtype=..., chat=..., **config kwargs) -> BlendEngine loaded from disk."""
    from blendrag import BlendEngine

    def make(family: str = "llama", dtype: str = "float32", chat: bool | None = False, **kw):
        return BlendEngine.from_pretrained(model_dir(family, **kw), dtype=dtype, device="cpu", chat=chat)

    return make
