"""Where an ingestion job reads chunk texts: a Chroma collection, a folder, a JSONL file.

Each source is a :class:`ChunkSource`: iterable (read lazily, in order, again on every
iteration) and sized (for progress bars). A source yields the texts exactly as they are
stored; the job tokenizes them as prompts do.

Order matters to ``ingest_source(..., profile=True)``, which measures each chunk after the one
before it: a Chroma collection is read in the order its ``get`` pages return (insertion order
for a local chromadb 1.x collection), a folder in sorted path order, a JSONL file in line
order. Store a document's chunks consecutively (name files so that they sort in document
order) for neighbours to be document neighbours.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("blendrag.ingest")

CHROMA_PAGE = 256


@dataclass(frozen=True)
class ChunkSource:
    """Chunk texts read lazily by ``read``; ``count`` is how many it yields."""

    name: str
    count: int
    read: Callable[[], Iterator[str]]
    bad_lines: tuple[str, ...] = ()  # what a source that skips bad records left out, and why

    def __iter__(self) -> Iterator[str]:
        return self.read()

    def __len__(self) -> int:
        return self.count


def chunks_from_chroma(persist_dir: str | Path, collection: str,
                       page_size: int = CHROMA_PAGE) -> ChunkSource:
    """The documents of a persisted Chroma collection (``chromadb.PersistentClient``), read
    ``page_size`` at a time. Entries stored without a document are left out.

    The collection is opened without an embedding function: reading documents needs none, and
    chromadb's default one would download a model."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    col = _open_chroma(Path(persist_dir), collection)
    total = col.count()

    def read() -> Iterator[str]:
        for offset in range(0, total, page_size):
            page = col.get(limit=page_size, offset=offset, include=["documents"])
            yield from (d for d in page["documents"] or () if d is not None)

    return ChunkSource(f"chroma {persist_dir}:{collection}", total, read)


def _open_chroma(path: Path, name: str):
    try:
        import chromadb
        from chromadb.errors import NotFoundError
    except ImportError as exc:
        raise ImportError("reading a Chroma collection needs chromadb: "
                          "pip install blendrag[chroma]") from exc
    if not path.is_dir():  # PersistentClient would create an empty database there
        raise FileNotFoundError(f"no Chroma directory at {path}")
    client = chromadb.PersistentClient(path=str(path))
    try:
        return client.get_collection(name, embedding_function=None)
    except NotFoundError:
        names = sorted(c.name for c in client.list_collections())
        raise ValueError(f"no collection {name!r} in {path}; it has {names}") from None


def chunks_from_folder(directory: str | Path, glob: str = "*.txt",
                       encoding: str = "utf-8", skip_bad_files: bool = False) -> ChunkSource:
    """One chunk per file matching ``glob`` under ``directory`` (``**/*.txt`` recurses), in
    sorted path order; each file's whole text is the chunk. A file that is not ``encoding``
    text or cannot be read raises ``ValueError`` naming it, or with ``skip_bad_files`` (every
    file then read once when the source is made) is logged and left out (``bad_lines`` lists
    them, with why)."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"no folder at {root}")
    files = sorted(p for p in root.glob(glob) if p.is_file())
    if not files:  # an empty run that says "chunks 0" would hide a mistyped pattern
        present = sorted({p.suffix or p.name for p in root.iterdir() if p.is_file()})[:8]
        raise FileNotFoundError(f"no file under {root} matches {glob!r} (files there end in: "
                                f"{', '.join(present) or 'nothing: the folder is empty'}; "
                                "'**/*.md' recurses)")

    bad: list[str] = []
    if skip_bad_files:
        for p in list(files):
            try:
                _read_file(p, encoding)
            except ValueError as exc:
                log.info("skipped %s", exc)  # listed in bad_lines: the caller reports them
                bad.append(str(exc))
                files.remove(p)

    def read() -> Iterator[str]:
        for p in files:
            yield _read_file(p, encoding)

    return ChunkSource(f"folder {root} ({glob})", len(files), read, tuple(bad))


def _read_file(path: Path, encoding: str) -> str:
    """The text of ``path``; ValueError naming it when it is not ``encoding`` text or cannot
    be read."""
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not {encoding} text ({exc.reason} at byte "
                         f"{exc.start})") from None
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({exc.strerror or exc})") from None


def chunks_from_jsonl(path: str | Path, field: str = "text",
                      skip_bad_lines: bool = False) -> ChunkSource:
    """One chunk per line of a JSON Lines file: the string under ``field`` of each object.
    Blank lines are skipped. Every line is checked when the source is made: a line that is not
    UTF-8 JSON, not an object, or lacks a string ``field`` raises ``ValueError`` naming the
    file and line number, or with ``skip_bad_lines`` is logged and left out (``bad_lines``
    lists them)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no file at {file}")
    good: list[int] = []
    bad: list[str] = []
    for n, line in _lines(file):
        if not line.strip():
            continue
        try:
            _field(line, field, file, n)
        except ValueError as exc:
            if not skip_bad_lines:
                raise
            log.info("skipped %s", exc)  # listed in bad_lines: the caller reports them
            bad.append(str(exc))
            continue
        good.append(n)
    keep = set(good)

    def read() -> Iterator[str]:
        for n, line in _lines(file):
            if n in keep:
                yield _field(line, field, file, n)

    return ChunkSource(f"jsonl {file} ({field})", len(good), read, tuple(bad))


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; a line that is not UTF-8 comes as "" after a check."""
    with file.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield n, _NOT_UTF8 + f"{exc.reason} at byte {exc.start}"


_NOT_UTF8 = "\0not-utf8\0"


def _field(line: str, field: str, file: Path, n: int) -> str:
    if line.startswith(_NOT_UTF8):
        raise ValueError(f"{file}:{n}: not UTF-8 ({line[len(_NOT_UTF8):]})")
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{file}:{n}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{file}:{n}: expected a JSON object, got {type(obj).__name__}")
    if field not in obj:
        raise ValueError(f"{file}:{n}: no field {field!r}")
    if not isinstance(obj[field], str):
        raise ValueError(f"{file}:{n}: field {field!r} is not a string "
                         f"({type(obj[field]).__name__})")
    return obj[field]
