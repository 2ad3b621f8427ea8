"""docs/architecture.md, "One request, end to end", stays true: a real warm LangChain ``invoke``
and a real LlamaIndex ``complete`` each run at most ``MAX_FILES`` package files, traced, every
one named in the section's list; the walk has at most 12 files; and the file table names files
that exist."""

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


MAX_FILES = 40
"""Package files a warm request runs today (the section says why not nano-vllm's ~14): the bound
makes the request path grow only on purpose. (Until 2026-11-28 it was 36, traced on a request
whose chunks the backfill had not stored yet: an exact full prefill, not the blend it was
meant to trace.)"""


def _walk_and_listed() -> tuple[list[str], set[str]]:
    """(the walk's files, in order; every file the section names) as paths relative to
    src/blendrag; a folder (``store/``) names every file in it."""
    section = _section("One request, end to end")
    walk = re.findall(r"^\| \d+ \| `([^`]+\.py)`", section, flags=re.M)
    listed = section.split("Every file a warm request runs")[1].split("`tests/")[0]
    files = set(walk)
    for name in re.findall(r"`([\w/]+(?:\.py|/))`", listed):
        if name.endswith("/"):
            files |= {str(p.relative_to(PACKAGE)) for p in (PACKAGE / name).rglob("*.py")}
        else:
            files.add(name)
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
    walk, files = _walk_and_listed()
    assert 1 <= len(walk) <= 12
    missing = sorted(f for f in files if not (PACKAGE / f).is_file())
    assert not missing, f"the section names files that do not exist: {missing}"


def _warm(engine: BlendEngine, call) -> set[str]:
    """The files ``call()`` runs once its chunks are stored: the first call computes them off
    its path (the backfill, engine/caches/backfill.py), so it is waited for, and the traced call
    must blend them."""
    call()
    assert engine.cache.backfill.wait(timeout=120), "the backfill did not store the chunks"
    return _files_run(call)


def _check(run: set[str]) -> None:
    _, files = _walk_and_listed()
    assert run <= files, f"files the section does not name: {sorted(run - files)}"
    assert len(run) <= MAX_FILES, (f"a warm request runs {len(run)} package files, more than "
                                   f"{MAX_FILES}: {sorted(run)}")


def test_a_warm_langchain_invoke_runs_only_the_files_listed(engine):
    llm = LangChainLLM(engine=engine, max_tokens=1)
    prompt = PREFIX + "".join(PASSAGES) + SUFFIX
    docs = [Document(page_content=p) for p in PASSAGES]
    run = _warm(engine, lambda: llm.invoke(prompt, documents=docs))
    assert llm.last_stats is not None and llm.last_stats.mode == "blend"
    assert llm.last_stats.cache.chunk_misses == 0 < llm.last_stats.cache.chunk_hits
    assert "engine/compute/loop.py" in run and "langchain/llm.py" in run
    _check(run)


def test_a_warm_llamaindex_complete_runs_only_the_files_listed(engine):
    llm = LlamaIndexLLM(engine, max_tokens=1)
    chunks = [p.strip() for p in PASSAGES]
    prompt = PREFIX + "\n\n".join(chunks) + SUFFIX
    run = _warm(engine, lambda: llm.complete(prompt, nodes=chunks))
    assert llm.last_stats is not None and llm.last_stats.mode == "blend"
    assert llm.last_stats.cache.chunk_misses == 0 < llm.last_stats.cache.chunk_hits
    assert "llamaindex/llm.py" in run and "engine/request/prefill.py" in run
    _check(run)


def test_the_file_table_names_existing_files_and_every_engine_file():
    table = _section("Data flow")
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    missing = sorted(n for n in named if "/" in n and not (PACKAGE / n).is_file())
    assert not missing, f"the file table names files that do not exist: {missing}"
    engine_files = {p.name for p in (PACKAGE / "engine").rglob("*.py")} - {"__init__.py"}
    listed = {n.rsplit("/", 1)[-1] for n in named}
    assert engine_files <= listed, f"engine files the table omits: {engine_files - listed}"
