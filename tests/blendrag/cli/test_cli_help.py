"""Every `blendrag` command explains itself: a description, help on every option with its
default, the same option names everywhere, and a parser that imports nothing heavy (so that
`--help` is fast; the time itself is measured by scripts/bench_cli.py, not here)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from blendrag.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "blendrag"):
    """(command path, parser) of the top-level parser and every sub-command, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{path} {name}: no one-line help in the command list"
                yield from _parsers(sub, f"{path} {name}")


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.option_strings and not isinstance(action, (argparse._HelpAction,
                                                             argparse._VersionAction)):
            yield action


COMMANDS = {path: p for path, p in _parsers(build_parser())}


def test_every_command_is_listed() -> None:
    assert set(COMMANDS) == {
        "blendrag", "blendrag precompute", "blendrag calibrate", "blendrag cache",
        "blendrag cache stats",
        "blendrag cache clear", "blendrag cache plan", "blendrag bench", "blendrag bench ttft",
        "blendrag bench store", "blendrag bench chat", "blendrag bench serve",
        "blendrag bench precompute", "blendrag bench match", "blendrag bench quality",
        "blendrag bench fidelity", "blendrag bench calibration", "blendrag demo"}


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_has_a_description(path: str) -> None:
    assert len(COMMANDS[path].description or "") > 20, f"{path}: no description"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_option_has_help_with_its_default(path: str) -> None:
    for action in _options(COMMANDS[path]):
        name = action.option_strings[-1]
        assert action.help and len(action.help) > 10, f"{path} {name}: no help"
        if action.default not in (None, False):
            assert "default" in action.help, f"{path} {name}: the help does not give the default"


def test_one_name_per_idea() -> None:
    """The same ideas are spelled the same in every command (README.md, "Command line")."""
    opts = {path: {a.option_strings[-1] for a in _options(p)} for path, p in COMMANDS.items()}
    for path in ("blendrag precompute", "blendrag demo", "blendrag bench ttft",
                 "blendrag bench store", "blendrag bench quality", "blendrag bench fidelity",
                 "blendrag bench chat", "blendrag bench serve", "blendrag calibrate",
                 "blendrag bench calibration"):
        assert {"--model", "--device", "--dtype", "--threads"} <= opts[path], path
    for path in ("blendrag precompute", "blendrag cache stats", "blendrag cache clear",
                 "blendrag demo", "blendrag bench store", "blendrag calibrate"):
        assert "--store-dir" in opts[path], path
    for path in ("blendrag precompute", "blendrag cache stats", "blendrag bench ttft",
                 "blendrag bench store", "blendrag bench quality"):
        assert "--json" in opts[path], path
    every = set().union(*opts.values())
    assert not every & {"--dir", "--workdir", "--profile", "--repeat"}
    threads = {p.get_default("threads") for path, p in COMMANDS.items()
               if "--threads" in opts[path]}
    assert len(threads) == 1  # one default for every command that runs the model


def test_json_means_the_same_everywhere(tmp_path, capsys) -> None:
    """--json alone: JSON on stdout instead of the text; --json FILE: the text and the file."""
    from blendrag.cli import main

    assert main(["cache", "stats", "--store-dir", str(tmp_path / "none"), "--json"]) == 0
    assert '"exists": false' in capsys.readouterr().out
    out = tmp_path / "stats.json"
    assert main(["cache", "stats", "--store-dir", str(tmp_path / "none"), "--json", str(out)]) == 0
    assert "no store here yet" in capsys.readouterr().out
    assert '"exists": false' in out.read_text()


def test_building_the_parser_imports_no_torch() -> None:
    code = ("import sys, blendrag.cli; blendrag.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers', 'chromadb', 'redis', 'diskcache', "
            "'ray') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_top_level_help_names_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert all(c in text for c in ("precompute", "cache", "bench", "demo"))
    assert "blendrag demo" in text  # where to start


def test_threads_follow_the_engines_auto_unless_given(monkeypatch) -> None:
    """Not given, --threads is BlendEngine's threads='auto': 1 on a CPU, torch's own count on a
    GPU (page-locked staging copies on them); given, the count (0: torch's own)."""
    import argparse

    import torch

    from blendrag.cli.options import apply_threads, engine_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert apply_threads(argparse.Namespace(threads=None, device="cuda:0")) == 2
        assert apply_threads(argparse.Namespace(threads=None, device="cpu")) == 1
        assert apply_threads(argparse.Namespace(threads=2, device="cpu")) == 2
    finally:
        torch.set_num_threads(before)
    assert [engine_threads(argparse.Namespace(threads=t)) for t in (None, 0, 3)] == \
        ["auto", None, 3]
