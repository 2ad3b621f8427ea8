"""EngineSpec: everything an engine is built from, as plain values that pickle.

One object names the model, how it is loaded, the store, the ingestion context, the caches and
the prompt settings. The engine (``spec.build()``), both frameworks' LLMs (``from_spec``), the
LlamaIndex transform and the distributed jobs (``IngestSettings`` extends it), and the CLI are
built from it, so a setting is written once. It crosses process boundaries (Ray actors, Dask
and Spark tasks, LlamaIndex's worker processes), where a model or an open store cannot: each
process builds its own engine from it.

What a stored chunk KV depends on besides its text, and where an ingestion's KVs and texts end
up (the LlamaIndex ingestion-cache key), are computed in ``integration/ingestion_key.py`` from a
spec (the model by name: the driver loads none) or from a built engine (the model by its
weights).

This module imports no torch: the engine is imported when ``build`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blendrag.config import AUTO, threads_valid
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.store.config import StoreConfig

if TYPE_CHECKING:
    from blendrag.engine.engine import BlendEngine
    from blendrag.store.protocol import KVStore

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineSpec:
    """How to build a ``BlendEngine``.

    model:        a short name (default ``smollm2-135m-instruct``), a model folder, a .gguf file
                  or a hub id, as the process that builds the engine sees it
    dtype:        weights and KV dtype ("float32", "bfloat16", "float16")
    device:       "cpu", "cuda", "cuda:N" (None: cuda when there is one, else cpu)
    gguf_file:    the GGUF file inside a ``model`` folder (None: none)
    cache_dir:    where a GGUF model is converted once (None: the loader's default)
    store:        the KV store's tiers (None: an in-process RAM store)
    context:      what stored chunk KVs are computed after (a ``ChunkContext``; None: the
                  engine's default)
    loading:      how cached rows are loaded and ``ratio="auto"`` chooses (a ``LoadingConfig``;
                  None: the default)
    compute:      the attention kernel and decoding (a ``ComputeConfig``; None: the default)
    prefix_cache_bytes: the prefix cache's budget on the device (0: off)
    prefix_cache_store: also keep the prefix cache's rows in the store's tiers
    history_bytes: the history cache's budget (None: the prefix cache's; 0: off)
    threads:      torch CPU threads while the engine computes ("auto": 1 on a CPU, torch's
                  own count on a GPU; None: torch's own count)
    chat, system: the chat template (None: when the tokenizer has one) and system message
    chunk_prefix: the canonical prefix chunk KVs are computed after (None: none; the
                  framework LLMs and ingestion jobs need one, e.g. "")

    ``BlendEngine.from_pretrained`` documents each engine setting at length.
    """

    model: str = str(DEFAULT_MODEL)
    dtype: str = "float32"
    device: str | None = None
    gguf_file: str | None = None
    cache_dir: str | None = None
    store: StoreConfig | None = None
    context: Any = None
    loading: Any = None
    compute: Any = None
    prefix_cache_bytes: int = 0
    prefix_cache_store: bool = False
    history_bytes: int | None = None
    threads: int | str | None = AUTO
    chat: bool | None = None
    system: str | None = None
    chunk_prefix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, Path)) or not str(self.model):
            raise ValueError(f"{self._name}.model must be a model name or path, got "
                             f"{self.model!r} (a spec names the model: the process that builds "
                             "the engine loads it)")
        object.__setattr__(self, "model", str(self.model))
        if self.dtype not in DTYPES:
            raise ValueError(f"{self._name}.dtype must be one of {', '.join(DTYPES)}, got "
                             f"{self.dtype!r}")
        if self.store is not None and not isinstance(self.store, StoreConfig):
            raise ValueError(f"{self._name}.store must be a StoreConfig or None, got "
                             f"{type(self.store).__name__} (an open store does not pickle: pass "
                             "it to build(store=...))")
        self._check_counts()
        for name in ("device", "gguf_file", "cache_dir", "system", "chunk_prefix"):
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"{self._name}.{name} must be a string or None, got {value!r}")

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _check_counts(self) -> None:
        if not threads_valid(self.threads):
            raise ValueError(f"{self._name}.threads must be a count >= 1, None or \"auto\", "
                             f"got {self.threads!r}")
        for name in ("prefix_cache_bytes", "history_bytes"):
            value = getattr(self, name)
            if value is None and name == "history_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{self._name}.{name} must be a byte count >= 0, got {value!r}")

    def field_values(self) -> dict[str, Any]:
        """Every ``EngineSpec`` field of this spec, by name."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSpec)}

    def engine_settings(self) -> dict[str, Any]:
        """The ``BlendEngine`` constructor's settings of this spec (the store excepted)."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSpec)
                if f.name not in _LOADING and f.name != "store"}

    def build(self, store: KVStore | None = None) -> BlendEngine:
        """A new engine: the model loaded here, ``store`` (else the spec's tiers, opened here;
        else a RAM store) as its KV store."""
        from blendrag.engine.engine import BlendEngine

        if store is None and self.store is not None:
            from blendrag.store import TieredKVStore

            store = TieredKVStore(self.store)
        return BlendEngine.from_pretrained(self.model, self.dtype, self.device,
                                           gguf_file=self.gguf_file, cache_dir=self.cache_dir,
                                           store=store, **self.engine_settings())


_LOADING = ("model", "dtype", "device", "gguf_file", "cache_dir")
"""The spec's fields that say how the model is loaded; the rest configure the engine."""


def spec_fields(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kwargs`` split into (EngineSpec fields, the rest): for a ``from_pretrained`` that takes
    both an engine's settings and its own."""
    names = {f.name for f in fields(EngineSpec)}
    return ({k: v for k, v in kwargs.items() if k in names},
            {k: v for k, v in kwargs.items() if k not in names})
