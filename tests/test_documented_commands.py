"""Every `blendrag ...` command shown in README.md and docs/*.md parses with the real command
line (a renamed or removed option fails here, not in a user's shell), and both examples run
to the end."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from blendrag.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_COMMAND = re.compile(r"^\s*(?:\$ )?(?:\.venv/bin/)?blendrag (?=[a-z-])")


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) of every `blendrag` command in the shell blocks of the docs
    (a block without a language is a usage synopsis, not a command): continuation lines
    joined, comments, notes in parentheses and optional parts (``[...]``) cut, ``...`` read as
    a value."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in _FENCE.finditer(path.read_text()):
            if m.group(1) not in ("bash", "sh", "shell", "console"):
                continue
            text = m.group(2).replace("\\\n", " ")
            for n, line in enumerate(text.splitlines()):
                hit = _COMMAND.search(line)
                if hit is None:
                    continue
                command = line[hit.end():].split(" #")[0].split("|")[0].split("&&")[0]
                command = re.sub(r"\[[^\]]*\]|\([^)]*\)\s*$", " ", command)
                # "--model ..." stands for a value; a trailing "..." for more options
                command = re.sub(r"(--[\w-]+)\s+\.\.\.", r"\1 X", command)
                command = command.replace("...", " ").strip()
                found.append((f"{path.relative_to(ROOT)}:{n}", command))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20, COMMANDS  # a regex that stopped matching would pass silently


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, command):
    parser = build_parser()
    try:
        parser.parse_args(shlex.split(command))
    except SystemExit as exc:  # argparse's way of refusing
        if exc.code not in (0, None):  # --help and --version exit 0
            pytest.fail(f"{where}: `blendrag {command}` does not parse")


@pytest.mark.processes
@pytest.mark.parametrize("example", ["langchain_rag.py", "llamaindex_rag.py", "serve_users.py"])
def test_an_example_runs_to_the_end(example):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--questions", "1"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Q: " in done.stdout and "ttft=" in done.stdout, done.stdout[-2000:]
