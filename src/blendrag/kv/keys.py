"""Content keys for chunk KVs (docs/architecture.md, "Chunk identity and keys").

A key depends on what determines the KV rows and on nothing else: the format version, the
model (architecture config, weights, dtype), the tokenizer, the prefix the chunk was computed
after, the ingestion context it was computed in (fixed filler passages, identified by a tag)
and the chunk's token ids. It does not depend on the chunk's position or neighbours in a
prompt.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import xxhash

log = logging.getLogger("blendrag.kv")

KEY_FORMAT_VERSION = 2  # 2: the ingestion context tag is part of the key


def hash_ids(ids: Sequence[int]) -> str:
    """sha256 of a token id sequence (little-endian int64), hex."""
    # An explicit '<i8' keeps the key identical on big-endian hosts sharing a Redis tier.
    return hashlib.sha256(np.asarray(list(ids), dtype="<i8").tobytes()).hexdigest()


def chunk_key(model_fp: str, tokenizer_fp: str, prefix_ids: Sequence[int],
              chunk_ids: Sequence[int], context: str = "") -> str:
    """Key of the KV of ``chunk_ids`` computed after ``prefix_ids`` in the ingestion context
    ``context`` (its tag; "" = right after the prefix)."""
    h = hashlib.sha256()
    for part in (f"blendrag-kv-v{KEY_FORMAT_VERSION}", model_fp, tokenizer_fp, hash_ids(prefix_ids),
                 hash_ids(chunk_ids), context):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


# Bytes of a GPU tensor copied to the host at a time while hashing (bounds the extra memory).
_HASH_PIECE = 64 << 20
# Config fields that do not change the KV rows. "architectures" is filled in by save_pretrained
# and "dtype" records the load argument; the weights' real dtypes are hashed.
_VOLATILE_CONFIG = ("_name_or_path", "transformers_version", "_commit_hash", "use_cache",
                    "_attn_implementation_autoset", "architectures", "dtype", "torch_dtype")


def model_fingerprint(model: torch.nn.Module) -> str:
    """Identity of a model's architecture, weights and dtype: the config (less the fields that
    do not change the KV rows) and every byte of every parameter and persistent buffer, with
    its name, shape and dtype (xxh3-128, one of the fastest hashes on a CPU core;
    docs/store.md, "Keys", has what it costs for a 7B model).

    Non-persistent buffers (RoPE's ``inv_freq``) are left out: they are derived from the
    config, which is hashed, and dynamic RoPE rewrites them at run time."""
    h = xxhash.xxh3_128()
    config = getattr(model, "config", None)
    if config is not None:
        d = config.to_dict()
        for volatile in _VOLATILE_CONFIG:
            d.pop(volatile, None)
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
    seen: dict[tuple, str] = {}  # tied weights are hashed once, then named as an alias
    for name, t in _named_weights(model):
        h.update(f"\0{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        where = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if where in seen and t.numel():
            h.update(f"alias of {seen[where]}".encode())
            continue
        seen[where] = name
        _hash_bytes(h, t.detach())
    return h.hexdigest()


def _named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(qualified name, tensor) of every parameter and persistent buffer, in state_dict order."""
    for mod_name, _owner, _kind, name, t in _weight_slots(model):
        yield f"{mod_name}.{name}" if mod_name else name, t


_Slot = tuple[str, torch.nn.Module, str, str, torch.Tensor]


def _weight_slots(model: torch.nn.Module) -> list[_Slot]:
    """(module name, module, "_parameters" or "_buffers", name in it, tensor) of every
    parameter and persistent buffer."""
    slots = []
    for mod_name, module in model.named_modules():
        for name, t in module._parameters.items():
            if t is not None:
                slots.append((mod_name, module, "_parameters", name, t))
        for name, t in module._buffers.items():
            if t is not None and name not in module._non_persistent_buffers_set:
                slots.append((mod_name, module, "_buffers", name, t))
    return slots


def _hash_bytes(h: xxhash.xxh3_128, t: torch.Tensor) -> None:
    flat = t.reshape(-1)
    if t.device.type == "cpu":
        h.update(flat.contiguous().view(torch.uint8).numpy())
        return
    step = max(1, _HASH_PIECE // max(1, t.element_size()))
    for i in range(0, flat.numel(), step):
        h.update(flat[i : i + step].to("cpu").contiguous().view(torch.uint8).numpy())


class ModelIdentity:
    """A model's fingerprint kept current: recomputed when a weight is changed in place.

    Every access to ``fingerprint`` checks each parameter and persistent buffer for a new
    tensor object, a new storage, dtype or shape, or a bumped version counter (in-place ops,
    ``load_state_dict``, ``copy_`` under ``no_grad``); that is a few attribute reads per
    weight, microseconds for a 7B model. Writes through ``tensor.data`` bypass the version
    counter: call ``refresh()`` after them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self.refresh()

    def refresh(self) -> str:
        """Hash the weights again (taking the state first: a change while hashing is seen)."""
        self._slots = _weight_slots(self._model)
        self._state = [_state(t) for *_, t in self._slots]
        self._fingerprint = model_fingerprint(self._model)
        return self._fingerprint

    @property
    def fingerprint(self) -> str:
        if self.changed():
            log.warning("model weights changed in place since they were fingerprinted; hashing "
                        "them again (stored KVs of the old weights are no longer used)")
            self.refresh()
        return self._fingerprint

    def changed(self) -> bool:
        """True when some weight is not the tensor, or not in the state, seen at ``refresh``."""
        for (_, owner, kind, name, t), (version, ptr) in zip(self._slots, self._state):
            # the cheap comparisons first: this runs for every key the engine makes
            if getattr(owner, kind).get(name) is not t or (
                    version is not None and t._version != version):
                return True
            if t.data_ptr() != ptr:
                return True
        return False


def _state(t: torch.Tensor) -> tuple[int | None, int]:
    """(version counter, storage address): an in-place write bumps the first, a new dtype,
    shape or device (``.to()``, ``.data = ...``) moves the second."""
    try:
        return t._version, t.data_ptr()
    except RuntimeError:  # an inference tensor keeps no version counter
        return None, t.data_ptr()


def tokenizer_fingerprint(tokenizer) -> str:
    """Identity of a tokenizer: its full serialized definition, specials and chat template."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(
        tokenizer, "_tokenizer", None
    )
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "all_special_tokens", []), default=str).encode())
    h.update(str(getattr(tokenizer, "chat_template", None)).encode())
    return h.hexdigest()
