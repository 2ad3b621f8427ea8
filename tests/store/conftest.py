"""Fixtures of the store tests: a store factory and a real redis-server on a free loopback port."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from blendrag_bench.redis_server import REDIS_BINARY, LocalRedis  # noqa: E402

from blendrag.store import StoreConfig, TieredKVStore  # noqa: E402


@pytest.fixture
def make_store(tmp_path):
    """factory(**StoreConfig overrides) -> TieredKVStore on tmp_path/'kv' by default; closed after."""
    stores: list[TieredKVStore] = []

    def make(**kw) -> TieredKVStore:
        kw.setdefault("disk_dir", tmp_path / "kv")
        kw.setdefault("ram_bytes", 1 << 20)
        kw.setdefault("disk_bytes", 4 << 20)
        store = TieredKVStore(StoreConfig(**kw))
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.close()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """One server per test module; tests keep apart by using their own key prefix."""
    if REDIS_BINARY is None:
        pytest.skip("redis-server binary not found (apt-get install redis-server) - Redis tier untested")
    pytest.importorskip("redis", reason="redis-py not installed (pip install 'blendrag[redis]')")
    server = LocalRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    return f"test:{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (two spin-waiting threads stall on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
