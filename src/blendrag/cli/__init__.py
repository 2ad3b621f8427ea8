"""`blendrag` command line.

Each command registers itself with ``register(subparsers)``: the core commands (``precompute``,
``cache``) from this package, and the commands of other installed packages through the
entry-point group ``blendrag.commands`` (``blendrag_demo`` adds ``demo``, ``blendrag_bench``
adds ``bench``), so the core never imports them.
"""

from __future__ import annotations

import argparse
import importlib
from importlib.metadata import entry_points

# Core modules that expose ``register(subparsers)``; each adds its own sub-commands.
COMMAND_MODULES = ["blendrag.cli.precompute", "blendrag.cli.cache"]
COMMAND_GROUP = "blendrag.commands"
"""Entry-point group of commands from other packages: ``name = "module:register"``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blendrag", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)

