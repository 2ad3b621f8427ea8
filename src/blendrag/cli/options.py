"""Options shared by every command that runs the model, spelled the same everywhere."""

from __future__ import annotations

import argparse

from blendrag.model.catalog import DEFAULT_MODEL


def add_model_options(p: argparse.ArgumentParser, default: str | None = DEFAULT_MODEL,
                      default_help: str | None = None) -> None:
    """--model, --gguf-file, --dtype, --device."""
    shown = default_help or default
    p.add_argument("--model", default=default,
                   help="a short name (smollm2-135m-instruct, demo), a model folder, a .gguf file "
                        f"or a hub id (default: {shown})")
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="GGUF file inside the --model folder to load (dequantized at load)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype (default: float32)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")


def model_kwargs(args: argparse.Namespace) -> dict:
    """``BlendEngine.from_pretrained`` keyword arguments of the options above."""
    return {"dtype": args.dtype, "device": args.device, "gguf_file": args.gguf_file}
