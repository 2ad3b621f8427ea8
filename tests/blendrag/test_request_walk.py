"""docs/architecture.md, "One request, end to end", stays true: a real LangChain ``invoke`` and
a real LlamaIndex ``complete`` run only files the walk or its leaves name, the walk has at
most 12 files, and the file table names files that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.documents import Document  # noqa: E402

from blendrag import BlendEngine  # noqa: E402
from blendrag.langchain import BlendLLM as LangChainLLM  # noqa: E402
from blendrag.llamaindex import BlendLLM as LlamaIndexLLM  # noqa: E402
from helpers.tiny import PASSAGES, PREFIX, SUFFIX  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGE = ROOT / "src" / "blendrag"


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    return DOC[start:DOC.index("\n## ", start + 1)]


def _walk_and_leaves() -> tuple[list[str], set[str]]:
    """(the walk's files, in order; every file the walk or its leaves name) as paths relative
    to src/blendrag. The leaves are groups separated by ``;``: in a group, a bare file name is in
    the folder of the group's first name; a folder names every file in it."""
    section = _section("One request, end to end")
    walk = re.findall(r"^\| \d+ \| `([^`]+\.py)`", section, flags=re.M)
    files = set(walk) | {"llamaindex/llm.py"}
    leaves = section.split("The leaves:")[1].split("`tests/")[0]
    for group in leaves.split(";"):
        folder = ""
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", group):
            if name.endswith("/"):
                files |= {str(p.relative_to(PACKAGE)) for p in (PACKAGE / name).rglob("*.py")}
            elif "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                files.add(name)
            else:
                files.add(folder + name)
    return walk, files


def _files_run(call) -> set[str]:
    """The src/blendrag files whose functions ``call()`` runs."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)):
            seen.add(str(Path(frame.f_code.co_filename).relative_to(PACKAGE)))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {f for f in seen if not f.endswith("__init__.py")}


@pytest.fixture(scope="module")
def engine(model_dir) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       chunk_prefix="")


def test_the_walk_is_short_and_names_real_files():
    walk, files = _walk_and_leaves()
    assert 1 <= len(walk) <= 12
    missing = sorted(f for f in files if not (PACKAGE / f).is_file())
    assert not missing, f"the walk or its leaves name files that do not exist: {missing}"


def test_a_langchain_invoke_runs_only_the_walk_and_its_leaves(engine):
    llm = LangChainLLM(engine=engine, max_tokens=1)
    prompt = PREFIX + "".join(PASSAGES) + SUFFIX
    docs = [Document(page_content=p) for p in PASSAGES]
    llm.invoke(prompt, documents=docs)  # the chunks computed and stored: the next one hits
    run = _files_run(lambda: llm.invoke(prompt, documents=docs))
    _, files = _walk_and_leaves()
    assert "engine/loop.py" in run and "langchain/llm.py" in run
    assert run <= files, f"files the doc's walk does not name: {sorted(run - files)}"


def test_a_llamaindex_complete_runs_only_the_walk_and_its_leaves(engine):
    llm = LlamaIndexLLM(engine, max_tokens=1)
    chunks = [p.strip() for p in PASSAGES]
    prompt = PREFIX + "\n\n".join(chunks) + SUFFIX
    llm.complete(prompt, nodes=chunks)
    run = _files_run(lambda: llm.complete(prompt, nodes=chunks))
    _, files = _walk_and_leaves()
    assert "llamaindex/llm.py" in run and "engine/request.py" in run
    assert run <= files, f"files the doc's walk does not name: {sorted(run - files)}"


def test_the_file_table_names_existing_files_and_every_engine_file():
    table = _section("Data flow")
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    missing = sorted(n for n in named if "/" in n and not (PACKAGE / n).is_file())
    assert not missing, f"the file table names files that do not exist: {missing}"
    engine_files = {p.name for p in (PACKAGE / "engine").glob("*.py")} - {"__init__.py"}
    listed = {n.rsplit("/", 1)[-1] for n in named}
    assert engine_files <= listed, f"engine files the table omits: {engine_files - listed}"
