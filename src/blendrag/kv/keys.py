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
from collections.abc import Sequence

import numpy as np
import torch

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


def model_fingerprint(model: torch.nn.Module, sample: int = 4096) -> str:
    """Identity of a model's architecture, weights and dtype.

    Hashing every weight of a 7B model would cost seconds, so each tensor contributes its
    name, shape, dtype and ``sample`` evenly spaced elements: any retraining, fine-tune or
    different random init changes the sample with overwhelming probability.
    """
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None:
        d = config.to_dict()
        # Fields that do not change the KV rows. "architectures" is filled in by save_pretrained
        # and "dtype" records the load argument; the weights' real dtypes are hashed below.
        for volatile in ("_name_or_path", "transformers_version", "_commit_hash", "use_cache",
                         "_attn_implementation_autoset", "architectures", "dtype", "torch_dtype"):
            d.pop(volatile, None)
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // sample)
        picked = flat[::step][:sample].to("cpu", copy=True).contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        h.update(picked.view(torch.uint8).numpy().tobytes() if picked.numel() else b"")
    return h.hexdigest()


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
