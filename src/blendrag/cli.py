"""`blendrag` command line. Each feature registers its own sub-commands (one module each)."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that expose ``register(subparsers)``; each adds its own sub-commands.
COMMAND_MODULES = [
    "blendrag.bench.cli",
    "blendrag.demo.cli",
    "blendrag.ingest.cli",
    "blendrag.store.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blendrag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
