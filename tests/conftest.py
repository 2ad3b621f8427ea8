"""Fixtures shared by every test folder: tiny models built on the fly (no hub access), chunk-KV
stores on a temporary directory, and a real redis-server. Helpers live in the ``helpers``
package (``tests/`` is on pytest's ``pythonpath``).

The whole run, child processes included, sees a temporary home of its own (``HOME``, and the
XDG folders under it), set here before anything imports blendrag, whose default folders
(``~/.cache/blendrag/kv``, ``~/.cache/blendrag/models``) are resolved from the home at import:
no test can read or write the user's KV store or converted models. It is one home for each
process running tests (each pytest-xdist worker), so the real-model tests convert the default
model into it once per worker (about 30 s), and it is removed when that process ends."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TEST_HOME = Path(tempfile.mkdtemp(prefix="blendrag-tests-home-")).resolve()
os.environ["HOME"] = str(TEST_HOME)
for _name, _sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_CONFIG_HOME", ".config"),
                    ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state")):
    os.environ[_name] = str(TEST_HOME / _sub)

import time  # noqa: E402
import uuid  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.servers import redis_cluster_or_skip, redis_or_skip, s3_or_skip  # noqa: E402
from helpers.tiny import build_config, build_tokenizer, save_model  # noqa: E402

# make test runs the suite on two pytest-xdist workers, one per core: one torch thread each (two
# threads a worker would spin-wait against the other worker's)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


# Long tests say what they are doing: a quiet `pytest -q` that sits on one real-model test for
# minutes cannot be told from a hang. The lines go to the terminal, capture suspended.
def _say(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run if blendrag resolved its default folders before the temporary home was
    set (something imported it before this file): its tests would reach the user's home."""
    from blendrag.model.catalog import DEFAULT_CACHE_DIR
    from blendrag.store.config import DEFAULT_DISK_DIR

    for folder in (DEFAULT_CACHE_DIR, DEFAULT_DISK_DIR):
        if not folder.is_relative_to(TEST_HOME):
            raise pytest.UsageError(f"blendrag resolved {folder} before tests/conftest.py set "
                                    f"the temporary home {TEST_HOME}: the tests would reach "
                                    "the user's home")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(TEST_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def test_home() -> Path:
    """The session's temporary home (what ``~`` means to every test and child process)."""
    return TEST_HOME


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-model tests first (the rest keeps its order): on two workers the longest files
    start at once, each on its own worker, instead of ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _LONG.clear()
    if item.get_closest_marker("slow") is not None:
        _say(item.config, f"\n[slow] {item.nodeid}: runs the real model, up to a few minutes "
                          "on 2 cores")
        _LONG.append(time.perf_counter())


def pytest_runtest_teardown(item: pytest.Item) -> None:
    if _LONG:
        _say(item.config, f"[slow] done in {time.perf_counter() - _LONG[0]:.0f} s")


_LONG: list[float] = []


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer_dir):
    """factory(family, **config kwargs) -> directory with model + tokenizer, built once per args."""
    made: dict[tuple, Path] = {}

    def make(family: str = "llama", **kw) -> Path:
        key = (family, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}")
            save_model(build_config(family, **kw), path)
            for f in tokenizer_dir.iterdir():
                shutil.copy(f, path / f.name)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="session")
def engine_for(model_dir):
    """factory(family, dtype=..., chat=..., context=..., compute=..., **config kwargs) ->
    BlendEngine loaded from disk (``compute``: a ``ComputeConfig``, e.g. FlexAttention). Chunks
    are stored as computed right after the chunk prefix (``NO_CONTEXT``) unless
    ``context`` says otherwise: most tests check invariants against chunks computed alone; the
    ingestion context's own tests (engine/test_context.py) pass the default ``ChunkContext()``.
    ``loading``: ``COMPUTED_FIRST`` unless told otherwise: these tests check each mode as asked
    over chunks a request computes and stores, where the default runs a request over chunks in
    no store as a full prefill (the first question's behaviour, engine/test_backfill.py)."""
    from blendrag import BlendEngine
    from blendrag.engine.caches.context import NO_CONTEXT
    from helpers.tiny import COMPUTED_FIRST

    def make(family: str = "llama", dtype: str = "float32", chat: bool | None = False,
             context=NO_CONTEXT, compute=None, loading=COMPUTED_FIRST, **kw):
        return BlendEngine.from_pretrained(model_dir(family, **kw), dtype=dtype, device="cpu",
                                           chat=chat, context=context, compute=compute,
                                           loading=loading)

    return make


@pytest.fixture(autouse=True)
def no_backfill_after():
    """No backfill worker computes into the next test: a blend request over chunks in no store
    queues them for a worker thread (engine/caches/backfill.py, on by default); what a test left
    queued is dropped when it ends, and the piece being computed finished first."""
    yield
    from blendrag.engine.caches.backfill import _LIVE

    for backfill in list(_LIVE):
        assert backfill.cancel(timeout=600), "a backfill piece still computing after 600 s"


@pytest.fixture
def make_store(tmp_path):
    """factory(wrap=None, **StoreConfig overrides) -> TieredKVStore on tmp_path/'kv' by default
    (``wrap``: applied to each tier, see ``TieredKVStore``); closed after. Entries are stored
    in the model's dtype unless a test asks for another ``kv_format``: the storage guarantees
    are asserted bit for bit (the compressed formats have tests of their own,
    tests/blendrag/store/test_kv_formats.py)."""
    from blendrag.store import StoreConfig, TieredKVStore

    stores: list[TieredKVStore] = []

    def make(wrap=None, **kw) -> TieredKVStore:
        kw.setdefault("disk_dir", tmp_path / "kv")
        kw.setdefault("ram_bytes", 1 << 20)
        kw.setdefault("disk_bytes", 4 << 20)
        kw.setdefault("kv_format", "model")
        store = TieredKVStore(StoreConfig(**kw), wrap=wrap)
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.close()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """One server per test module; tests keep apart by using their own key prefix. Skipped,
    saying why, where no redis-server can start (``helpers.servers``)."""
    pytest.importorskip("redis", reason="redis-py not installed (pip install 'blendrag[redis]')")
    server = redis_or_skip(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster():
    """One three-node Redis Cluster for the session (about 2 s to start); tests keep apart by
    their own key prefix. Skipped, saying why, where none can start."""
    pytest.importorskip("redis", reason="redis-py not installed (pip install 'blendrag[redis]')")
    cluster = redis_cluster_or_skip()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def s3_server():
    """One Ceph RGW for the session (10-20 s to start); tests keep apart by their own prefix.
    Skipped, saying why, where none can start."""
    server = s3_or_skip()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The session's S3 server, with boto3's credentials for it in this test's environment."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


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
