"""Options shared by several commands, spelled, defaulted and explained the same everywhere.

One name per idea (README.md, "Command line", has the table): ``--model`` (the model to run),
``--store-dir`` (the persistent KV store), ``--threads`` (torch CPU threads), ``--json [FILE]``
(the result as JSON), ``--profile-neighbours K``, ``--chat/--no-chat``, ``--no-progress``.

Nothing heavy is imported here: every ``blendrag ... --help`` builds all the parsers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blendrag.config import DEFAULT_THREADS
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.store.config import DEFAULT_DISK_DIR

if TYPE_CHECKING:
    from blendrag.spec import EngineSpec
    from blendrag.store.auth import StoreKeys

# --threads 0 keeps torch's own choice, which can win on an idle machine with many cores.


def add_model_options(p: argparse.ArgumentParser, default: str = DEFAULT_MODEL,
                      default_help: str | None = None) -> None:
    """--model, --gguf-file, --dtype, --device, --threads."""
    shown = default_help or default
    p.add_argument("--model", default=default,
                   help="a short name (smollm2-135m-instruct, demo), a model folder, a .gguf file "
                        f"or a hub id (default: {shown})")
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="GGUF file inside the --model folder to load, dequantized at load "
                        "(default: none)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype (default: float32)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")
    add_threads_option(p)


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_threads, default=None, metavar="N",
                   help="torch CPU threads; 0: torch's own choice, one per core (default: "
                        f"as BlendEngine's threads='auto': {DEFAULT_THREADS} on a CPU, the "
                        "fastest on a small, busy one; torch's own on a GPU, whose copies "
                        "from pageable memory use them)")


def _threads(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--threads takes a count >= 0, got {text!r}")
    return int(text)


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's CPU threads from ``--threads`` (not given: ``DEFAULT_THREADS`` unless the
    model runs on a GPU); returns the count in effect."""
    import torch

    threads = args.threads
    if threads is None and not _on_gpu(getattr(args, "device", None)):
        threads = DEFAULT_THREADS
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def engine_threads(args: argparse.Namespace) -> int | str | None:
    """``--threads`` as an engine's ``threads`` setting: the count, None for 0 (torch's own),
    "auto" when not given (decided by the device the engine runs on)."""
    if args.threads is None:
        return "auto"
    return args.threads or None


def _on_gpu(device: str | None) -> bool:
    """Whether ``--device`` (None: cuda when available) is a GPU."""
    import torch

    if device is None:
        return torch.cuda.is_available()
    return not str(device).startswith("cpu")


def engine_spec(args: argparse.Namespace, **settings: Any) -> EngineSpec:
    """The engine the options above describe (``--model``, ``--dtype``, ``--device``,
    ``--gguf-file``), with ``settings`` (``chat``, ``chunk_prefix``, ...)."""
    from blendrag.spec import EngineSpec

    # threads=None: the engine keeps the process's count, which ``apply_threads`` set
    return EngineSpec(model=str(args.model), dtype=args.dtype, device=args.device,
                      gguf_file=args.gguf_file, threads=None, **settings)


def add_chat_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap prompts in the tokenizer's chat template (default: when it has "
                        "one, never for the demo model)")


def add_store_dir_option(p: argparse.ArgumentParser, default: Path | None = DEFAULT_DISK_DIR,
                         default_help: str | None = None) -> None:
    p.add_argument("--store-dir", type=Path, default=default, metavar="DIR",
                   help="disk tier of the persistent KV store (default: "
                        f"{default_help or default})")


def add_redis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", default=None, metavar="URL",
                   help="also the Redis tier at this URL, e.g. redis://127.0.0.1:6379/0 "
                        "(default: none)")
    p.add_argument("--redis-prefix", default="blendrag:kv:",
                   help="the prefix of the store's Redis keys (default: blendrag:kv:)")
    p.add_argument("--s3-url", default=None, metavar="s3://BUCKET/PREFIX",
                   help="also the S3 tier: objects under this prefix (credentials from boto3's "
                        "chain: AWS_* variables, ~/.aws; default: none)")
    p.add_argument("--s3-endpoint", default=None, metavar="URL",
                   help="with --s3-url: the S3 server when it is not AWS's, e.g. "
                        "http://127.0.0.1:7480 (Ceph RGW, MinIO)")


def add_namespace_options(p: argparse.ArgumentParser,
                          default: str = "the default namespace") -> None:
    """``--namespace`` and ``--store-keys``: whose entries, and the keys that sign and name
    them (``StoreConfig.namespace``, ``StoreConfig.auth_key``); ``default``: what the command
    acts on without ``--namespace``, in words."""
    p.add_argument("--namespace", default="", metavar="NS",
                   help="the tenant (or tenant/user) whose entries to act on, apart from every "
                        f"other namespace's (default: {default})")
    p.add_argument("--store-keys", default=None, metavar="FILE|env",
                   help="the deployment's store keys, which sign, verify and name entries: a "
                        "file of id=secret lines, or 'env' for $BLENDRAG_STORE_KEYS (default: "
                        "none: entries unsigned, as before)")


def store_keys(args: argparse.Namespace) -> StoreKeys | None:
    """The ``StoreKeys`` ``--store-keys`` names (None without it)."""
    from blendrag.store.auth import StoreKeys

    if args.store_keys is None:
        return None
    if args.store_keys == "env":
        return StoreKeys.from_env()
    return StoreKeys.from_file(args.store_keys)


def add_profile_neighbours_option(p: argparse.ArgumentParser, default: int, what: str) -> None:
    p.add_argument("--profile-neighbours", type=_count, default=default, metavar="K",
                   help=f"{what} (default: {default})")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {text!r}")
    return int(text)


def add_json_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` alone: the result as JSON on stdout instead of the text; ``--json FILE``: also
    write it to FILE. The same in every command."""
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help=f"{what} as JSON: on stdout instead of the text, or with FILE written "
                        "there as well as the text (default: text only)")


def emit(args: argparse.Namespace, payload: object, text: str) -> None:
    """Print ``text`` or the JSON of ``payload`` as ``--json`` asks (see add_json_option)."""
    data = json.dumps(payload, indent=2)
    if args.json == "-":
        print(data)
        return
    print(text)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data + "\n")
        print(f"wrote {path}", file=sys.stderr)


def add_progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress lines on stderr (default: shown)")


def csv_of(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    """argparse type: a comma-separated list of ``kind`` values (empty items skipped)."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    return parse
