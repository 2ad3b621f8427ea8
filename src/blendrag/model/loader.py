"""Load an HF causal LM + tokenizer for the engine: a short name, a local folder, a GGUF file
or a hub id."""

from __future__ import annotations

import contextlib
import difflib
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import torch

from blendrag.model.catalog import (
    CATALOG,
    converted_model,
    require_gguf,
    strip_gguf_quantizer,
)

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


MODEL_GROUP = "blendrag.models"
"""Entry-point group of short model names that live in a folder of an installed package (not
converted): ``name = "module:function"``, the function returning the folder. ``blendrag_demo``
provides ``demo``; the core never imports it."""


def local_models() -> dict[str, Callable[[], Path]]:
    """Short names of packaged model folders, read from the ``blendrag.models`` entry points
    (each loaded only when its name is asked for)."""
    return {ep.name: _lazy(ep) for ep in entry_points(group=MODEL_GROUP)}


def _lazy(ep: EntryPoint) -> Callable[[], Path]:
    return lambda: Path(ep.load()())


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/"auto": cuda when available, else cpu. A device this machine lacks is refused."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"not a device: {device!r} (use cpu, cuda, cuda:N or auto)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device here (use "
                         "--device cpu)")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"unsupported device {device!r} (use cpu, cuda, cuda:N or auto)")
    return dev


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` reads a model: a folder or hub id, and a GGUF file in it."""

    path: str
    gguf_file: str | None = None


def known_names() -> list[str]:
    return sorted([*CATALOG, *local_models()])


def resolve_model(name_or_path: str | Path, gguf_file: str | None = None,
                  cache_dir: Path | None = None) -> ModelSource:
    """Turn what a user typed into something ``from_pretrained`` can read.

    - a short name (``smollm2-135m-instruct``; see ``known_names()``): the packaged model,
      converted once to safetensors in ``cache_dir``;
    - ``path/to/file.gguf``, or a folder with ``gguf_file``: a GGUF file, dequantized at load;
    - an existing folder: a saved HF model;
    - ``org/name``: a hub id (needs the hub or its local cache).
    A path that exists nowhere is refused with FileNotFoundError."""
    text = str(name_or_path)
    if gguf_file is None and text in CATALOG:
        return ModelSource(str(converted_model(text, cache_dir)))
    local = local_models() if gguf_file is None else {}
    if text in local:
        return ModelSource(str(local[text]()))
    path = Path(text).expanduser()
    if gguf_file is None and path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return ModelSource(str(path.parent), path.name)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{path} is a file, not a model folder (a .gguf file, a folder with "
                             f"config.json, or a name: {', '.join(known_names())})")
        if gguf_file is not None and not (path / gguf_file).is_file():
            raise FileNotFoundError(f"no GGUF file {gguf_file!r} in {path}")
        if gguf_file is None and not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a saved model folder (a GGUF "
                                    f"file needs --gguf-file NAME)")
        return ModelSource(str(path), gguf_file)
    if _looks_like_path(text):
        raise FileNotFoundError(f"no model at {text!r}: no such folder or file, and not a known "
                                f"name ({', '.join(known_names())})")
    if "/" not in text:
        # not a hub id (those are org/name): a mistyped short name fails here, at once, rather
        # than after the hub client's retries
        close = difflib.get_close_matches(text, known_names(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown model {text!r}: not a known name, a folder, a .gguf file or a "
                         f"hub id (org/name){hint} Known names: {', '.join(known_names())}")
    return ModelSource(text, gguf_file)  # a hub id


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~",
                            "\\")) or text.count("/") > 1 or "\\" in text or text.endswith("/")


def load_model_and_tokenizer(name_or_path: str | Path, dtype: str | torch.dtype = "float32",
                             device: str | torch.device | None = None, gguf_file: str | None = None,
                             cache_dir: Path | None = None, **kwargs):
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` in eval mode on ``device`` (see
    :func:`resolve_model` for what ``name_or_path`` may be)."""
    torch_dtype = resolve_dtype(dtype)
    dev = resolve_device(device)
    source = resolve_model(name_or_path, gguf_file, cache_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if source.gguf_file:
        require_gguf()
    if not Path(source.path).exists():
        # a hub id: its local cache first; the hub only when it answers
        extra["local_files_only"] = hub_cached(source.path) or not hub_reachable()
    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(source.path, **extra)
            model: Any = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype,
                                                              **extra, **kwargs)
    except OSError as e:
        if Path(source.path).exists():
            raise
        where = ("is a hub id that is not in the local Hugging Face cache, and the hub cannot be "
                 "reached"
                 if extra.get("local_files_only") else "is a hub id that could not be loaded "
                 "from the hub (no such repository, or no access)")
        raise FileNotFoundError(f"model {source.path!r} {where}; known names: "
                                f"{', '.join(known_names())}. ({str(e).splitlines()[0]})") from e
    if source.gguf_file:
        strip_gguf_quantizer(model)
    model.to(dev).eval()
    return model, tokenizer


def hub_cached(repo_id: str) -> bool:
    """Whether ``repo_id``'s config is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the hub's host accepts a connection within ``timeout_s`` (and the hub client is
    not set offline): one TCP connect, instead of the client's retries against a hub that is
    not there."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    parsed = urllib.parse.urlparse(constants.ENDPOINT)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """No per-tensor "Loading weights" bars (they drown every command's output)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
