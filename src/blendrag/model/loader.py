"""Load an HF causal LM + tokenizer (hub id or local path) for the engine."""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model_and_tokenizer(name_or_path: str | Path, dtype: str | torch.dtype = "float32",
                             device: str | torch.device | None = None, **kwargs):
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = resolve_dtype(dtype)
    dev = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=torch_dtype, **kwargs)
    model.to(dev).eval()
    return model, tokenizer
