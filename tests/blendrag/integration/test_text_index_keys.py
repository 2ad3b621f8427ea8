"""A persisted text index under the store's keys: a row planted in its SQLite file (or copied from
another tenant's index) is never used to lay out a prompt, its digests are keyed, and with
``encrypt=True`` neither the file nor its WAL holds a passage in clear. The index an LLM uses by
default takes the keys from the KV store's config."""

from __future__ import annotations

import hashlib
import logging
import sqlite3

import pytest

from blendrag import EngineSpec
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.integration.default_index import default_text_index
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.store import StoreConfig
from blendrag.store.auth import StoreKeys

KEYS = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
ATTACKER = StoreKeys({"k1": b"an-attackers-own-secret-012345"}, "k1")
DOCS = [
    "Lionel Messi was born in Rosario, Argentina, in 1987.",
    "Cristiano Ronaldo was born in Funchal, Madeira, in 1985.",
]
# a text that spans both passages: recorded, it would turn the two chunks into one
PLANTED = DOCS[0] + "\n\n" + DOCS[1]
PROMPT = "Context:\n" + PLANTED + "\n\nQuestion: who is older?"
FILES = ("texts.sqlite3", "texts.sqlite3-wal")


def _plant(folder, table: str, *row) -> None:
    with sqlite3.connect(folder / "texts.sqlite3") as db:
        marks = ", ".join("?" * len(row))
        columns = "digest, text" if len(row) == 2 else "digest, text, tag"
        db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", row)


def _bytes(folder) -> bytes:
    return b"".join((folder / f).read_bytes() for f in FILES if (folder / f).exists())


def test_a_planted_row_changes_the_layout_without_keys_and_not_with_them(tmp_path, caplog):
    plain, keyed = tmp_path / "plain", tmp_path / "keyed"
    ChunkTextIndex(plain).record(DOCS)
    ChunkTextIndex(keyed, keys=KEYS).record(DOCS)
    _plant(plain, "texts", "x", PLANTED)
    assert ChunkTextIndex(plain).split(PROMPT).chunks == (PLANTED,)  # why keys matter
    _plant(keyed, "signed_texts", "x", PLANTED, "k1:" + "0" * 64)  # a forged tag
    _plant(keyed, "signed_texts", "y", PLANTED, ATTACKER.sign(PLANTED.encode()))
    _plant(keyed, "texts", "z", PLANTED)  # an unsigned row
    with caplog.at_level(logging.WARNING):
        index = ChunkTextIndex(keyed, keys=KEYS)
    assert index.split(PROMPT).chunks == (DOCS[0], "\n\n", DOCS[1])
    assert PLANTED not in index and len(index) == 2
    assert "ignored 2 row(s)" in caplog.text and "1 unsigned row(s)" in caplog.text
    index.refresh()  # read again: still not used
    assert PLANTED not in index


def test_a_row_of_another_tenants_index_does_not_verify_here(tmp_path):
    ChunkTextIndex(tmp_path / "a", keys=KEYS, namespace="tenant-a").record([PLANTED])
    with sqlite3.connect(tmp_path / "a" / "texts.sqlite3") as db:
        row = db.execute("SELECT digest, text, tag FROM signed_texts").fetchone()
    ChunkTextIndex(tmp_path / "b", keys=KEYS, namespace="tenant-b").record(DOCS)
    _plant(tmp_path / "b", "signed_texts", *row)  # copied across, signature and all
    index = ChunkTextIndex(tmp_path / "b", keys=KEYS, namespace="tenant-b")
    assert PLANTED not in index and DOCS[0] in index
    assert PLANTED in ChunkTextIndex(tmp_path / "a", keys=KEYS, namespace="tenant-a")


def test_digests_are_keyed(tmp_path):
    ChunkTextIndex(tmp_path / "idx", keys=KEYS).record(DOCS)
    with sqlite3.connect(tmp_path / "idx" / "texts.sqlite3") as db:
        digests = {d for (d,) in db.execute("SELECT digest FROM signed_texts")}
    assert len(digests) == 2
    assert not digests & {hashlib.sha256(t.encode()).hexdigest() for t in DOCS}


def test_encrypted_index_holds_no_passage_in_clear(tmp_path):
    pytest.importorskip("cryptography")
    folder = tmp_path / "idx"
    index = ChunkTextIndex(folder, keys=KEYS, encrypt=True)
    index.record(DOCS)
    assert (folder / "texts.sqlite3-wal").exists()  # open: the rows are in the WAL now
    words = [t.encode() for t in DOCS] + [b"Rosario", b"Funchal"]
    assert not any(w in _bytes(folder) for w in words)
    signed_only = ChunkTextIndex(tmp_path / "clear", keys=KEYS)  # the control: signed, in clear
    signed_only.record(DOCS)
    assert all(w in _bytes(tmp_path / "clear") for w in words)
    reopened = ChunkTextIndex(folder, keys=KEYS, encrypt=True)  # read back and decrypted
    assert reopened.split(PROMPT).chunks == (DOCS[0], "\n\n", DOCS[1])
    index._rows.close()  # type: ignore[union-attr]  # checkpoint the WAL into the file
    reopened._rows.close()  # type: ignore[union-attr]
    assert not any(w in _bytes(folder) for w in words)
    # a signed but unencrypted row in an encrypted index is refused
    _plant(folder, "signed_texts", "p", PLANTED, KEYS.sign(PLANTED.encode()))
    assert PLANTED not in ChunkTextIndex(folder, keys=KEYS, encrypt=True)


def test_encrypt_needs_keys(tmp_path):
    with pytest.raises(ValueError, match="keys"):
        ChunkTextIndex(tmp_path / "idx", encrypt=True)
    with pytest.raises(ValueError, match="StoreKeys"):
        ChunkTextIndex(tmp_path / "idx", keys="secret")  # type: ignore[arg-type]


def test_the_default_index_takes_the_stores_keys(model_dir, tmp_path):
    pytest.importorskip("cryptography")
    store = StoreConfig(ram_bytes=1 << 20, disk_dir=tmp_path / "kv", auth_key=KEYS,
                        encrypt=True, namespace="acme")
    engine = EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="",
                        context=NO_CONTEXT, threads=None, store=store).build()
    index = default_text_index(engine)
    index.record(DOCS)
    assert index.path is not None and not any(t.encode() in _bytes(index.path) for t in DOCS)
    _plant(index.path, "signed_texts", "x", PLANTED, "k1:" + "0" * 64)
    _plant(index.path, "texts", "y", PLANTED)
    again = default_text_index(engine)
    assert again.split(PROMPT).chunks == (DOCS[0], "\n\n", DOCS[1])


def test_an_index_folder_that_is_a_link_is_refused(tmp_path):
    from blendrag.integration.text_index import ChunkTextIndex

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "text_index").symlink_to(outside)
    with pytest.raises(ValueError, match="symbolic link"):
        ChunkTextIndex(tmp_path / "text_index")
    assert list(outside.iterdir()) == []
