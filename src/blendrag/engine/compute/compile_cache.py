"""torch.compile's caches kept in a folder, so that a new process loads what an earlier one
compiled instead of compiling again (FlexAttention on a GPU: about 10 s at the first blend
request of a process).

PyTorch packs what its compiler made in a process (FX graphs, Inductor kernels, autotuning
results, Triton binaries) into one blob, ``torch.compiler.save_cache_artifacts()``, and puts it
back with ``load_cache_artifacts``: its "mega-cache". One file per PyTorch version and device
(a kernel compiled for one GPU is not another's), written atomically, in a folder of the
user's own (``DEFAULT_FOLDER``), never in the KV store: the blob holds code and pickled data
that the compiler runs, so the folder must be as trusted as the installed packages, like
PyTorch's own caches under the user's home. A file that cannot be read or loaded is a cold
start (logged), never an error.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

DEFAULT_FOLDER = Path.home() / ".cache" / "blendrag" / "compile"


def cache_file(folder: Path, device: torch.device) -> Path:
    """The file of ``device``'s compiled artifacts under this PyTorch version in ``folder``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = f"cuda-{torch.cuda.get_device_name(index)}"
    else:
        where = device.type
    tag = re.sub(r"[^A-Za-z0-9.+-]+", "_", f"torch-{torch.__version__}-{where}")
    return folder / f"{tag}.bin"


def load(folder: Path, device: torch.device) -> int:
    """Load the artifacts kept for ``device`` in ``folder`` into this process's compiler
    caches; the bytes loaded (0: none kept, or unusable: then a warning)."""
    path = cache_file(folder, device)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("compile cache %s unreadable (%s): compiling at warm-up", path, exc)
        return 0
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:  # a truncated or foreign blob: the compiler's own errors vary
        info, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "its checksum or format was refused"
    if info is None:  # PyTorch answers a blob it refuses with None
        log.warning("compile cache %s not loaded (%s): compiling at warm-up", path, why)
        return 0
    return len(data)


def save(folder: Path, device: torch.device) -> int:
    """Write what this process compiled so far to ``device``'s file in ``folder`` (atomically:
    another process reads the old file or the new one); the bytes written, 0 when nothing was
    compiled."""
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as exc:  # the compiler cannot pack its caches here: nothing to keep
        log.warning("compile cache not saved (%s: %s)", type(exc).__name__, exc)
        return 0
    if saved is None or not saved[0]:
        return 0
    data = saved[0]
    path = cache_file(folder, device)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("compile cache %s not written (%s)", path, exc)
        return 0
    return len(data)
