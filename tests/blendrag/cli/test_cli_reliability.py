"""The CLI's failure paths: bad input is one ``error:`` line and exit status 2, a job
that could not store every chunk says which and exits 1; never a traceback."""

from __future__ import annotations

import json

import pytest

from blendrag.cli import main
from helpers.tiny import PASSAGES, PREFIX

pytestmark = pytest.mark.usefixtures("one_thread")


def _args(model, store_dir, *source: str) -> list[str]:
    return ["precompute", "--model", str(model), "--device", "cpu", "--store-dir", str(store_dir),
            "--disk-bytes", "8M", "--no-chat", "--prefix", PREFIX, "--no-progress", *source]


def _one_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


BAD_LINES = {
    "not-json": ("{not json", "not JSON"),
    "no-field": ('{"body": "x"}', "no field 'text'"),
    "not-a-string": ('{"text": 42}', "is not a string"),
    "array": ('["a", "b"]', "expected a JSON object, got list"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_with_strict_a_bad_jsonl_line_is_one_error_naming_the_line(model_dir, tmp_path, capsys,
                                                                    case):
    line, reason = BAD_LINES[case]
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": PASSAGES[0]}) + "\n\n" + line + "\n")
    assert main(_args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), "--strict")) == 2
    _one_error(capsys, "c.jsonl:3:", reason)
    assert not (tmp_path / "kv").exists()  # checked before the model was loaded


@pytest.mark.parametrize("flag", [(), ("--skip-bad-lines",)])
def test_bad_lines_are_skipped_with_a_count_and_the_rest_ingested(model_dir, tmp_path, capsys,
                                                                  flag):
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join([json.dumps({"text": PASSAGES[0]}), *(v[0] for v in BAD_LINES.values()),
                            json.dumps({"text": PASSAGES[1]})]) + "\n")
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f), *flag, "--json")
    assert main(argv) == 1  # the job ran, but not every line was stored
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert (summary["chunks"], summary["computed"], summary["failures"]) == (2, 2, [])
    assert len(summary["unreadable"]) == 4 and "c.jsonl:2: not JSON" in summary["unreadable"][0]
    assert "skipped 4 unreadable lines" in err and err.count("  skipped ") == 4


def test_strict_and_skip_bad_lines_together_are_refused(model_dir, tmp_path, capsys, jsonl):
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(jsonl), "--strict",
                 "--skip-bad-lines")
    assert main(argv) == 2
    _one_error(capsys, "contradict")


def test_a_non_utf8_file_in_a_folder_is_skipped_and_named(model_dir, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(PASSAGES[0])
    (tmp_path / "docs" / "b.txt").write_bytes(b"caf\xe9 in latin-1")
    (tmp_path / "docs" / "c.txt").write_text(PASSAGES[1])
    argv = _args(model_dir("llama"), tmp_path / "kv", "--folder", str(tmp_path / "docs"))
    assert main([*argv, "--json"]) == 1  # one file not stored: said in the exit status
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["computed"] == 2  # a.txt and c.txt: one bad file stops nothing
    assert ["b.txt: not utf-8 text" in u for u in summary["unreadable"]] == [True]
    assert "skipped 1 unreadable files" in err and "b.txt: not utf-8 text" in err
    assert main(argv) == 1
    assert "unreadable files left out: 1" in capsys.readouterr().out
    assert main([*argv, "--strict"]) == 2  # --strict: stops at the first, naming it
    _one_error(capsys, "b.txt", "not utf-8 text")


@pytest.fixture
def jsonl(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": PASSAGES[0]}) + "\n")
    return f


def test_a_model_path_that_does_not_exist(tmp_path, jsonl, capsys):
    assert main(_args(tmp_path / "no" / "such-model", tmp_path / "kv", "--jsonl",
                      str(jsonl))) == 2
    _one_error(capsys, "no model at")


def test_a_hub_id_while_offline(tmp_path, jsonl, capsys, monkeypatch):
    from transformers import AutoTokenizer

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    assert main(_args("some-org/some-model", tmp_path / "kv", "--jsonl", str(jsonl))) == 2
    _one_error(capsys, "'some-org/some-model'", "hub id", "couldn't connect")


def test_an_unknown_device(model_dir, tmp_path, jsonl, capsys):
    argv = _args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(jsonl))
    argv[argv.index("--device") + 1] = "tpu9"
    assert main(argv) == 2
    _one_error(capsys, "tpu9")


def test_a_store_dir_that_is_a_file_fails_before_computing_anything(model_dir, tmp_path, capsys,
                                                                     monkeypatch):
    from blendrag.engine.caches.chunk_cache import ChunkCache

    def never(*args, **kwargs):
        raise AssertionError("a chunk was computed for a store that cannot keep it")

    monkeypatch.setattr(ChunkCache, "precompute", never)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES))
    assert main(_args(model_dir("llama"), blocker, "--jsonl", str(f))) == 2
    _one_error(capsys, "the KV store cannot keep what ingestion computes", str(blocker),
               "--store-dir")


def test_a_chunk_longer_than_the_context_is_refused_and_listed(model_dir, tmp_path, capsys):
    f = tmp_path / "c.jsonl"
    long = "the quick brown fox jumps over the lazy dog " * 150
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in [PASSAGES[0], long]))
    assert main([*_args(model_dir("llama"), tmp_path / "kv", "--jsonl", str(f)), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["computed"], summary["refused"]) == (1, 1)
    assert summary["failures"][0]["index"] == 1 and "longer than" in summary["failures"][0][
        "reason"]


@pytest.mark.parametrize("command", ["stats", "clear"])
@pytest.mark.parametrize("url,needle", [("redis://127.0.0.1:1/0", "ConnectionError"),
                                        ("http://localhost:6379", "redis_url must start"),
                                        ("redis://[bad", "ValueError")])
def test_cache_commands_with_a_bad_redis_url(tmp_path, capsys, command, url, needle):
    pytest.importorskip("redis")
    assert main(["cache", command, "--store-dir", str(tmp_path / "kv"), "--redis-url", url]) == 2
    line = _one_error(capsys, f"blendrag cache {command}: error:", needle)
    assert "Traceback" not in line


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, capsys, monkeypatch):
    """``blendrag cache stats | head -2``: the closed pipe is not the store's failure, and no
    error line (twice, with the interpreter's own) follows."""
    from blendrag.cli import cache

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cache, "_stats", closed_pipe)
    assert main(["cache", "stats", "--store-dir", str(tmp_path)]) == 1
    assert "error" not in capsys.readouterr().err
