"""The package never synchronizes the whole device, only the stream it computes on: on CUDA a
device-wide sync fails ("operation not permitted when stream is capturing") while another
thread captures a CUDA graph, and serving runs two such threads (the decoding loop captures
its batched step while a prefill worker finishes a prefill), so a served request would fail
and the capture be lost for the rest of the run. Checked in the source: no CUDA here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "blendrag"


def _device_syncs(source: str) -> list[int]:
    """Lines that call ``torch.cuda.synchronize`` (or ``cuda.synchronize``)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "synchronize" and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "cuda"]


def test_the_check_sees_a_device_sync_and_not_a_stream_sync():
    assert _device_syncs("import torch\ntorch.cuda.synchronize(d)\n") == [2]
    assert _device_syncs("torch.cuda.current_stream(d).synchronize()\nev.synchronize()") == []


def test_no_file_of_the_package_synchronizes_the_device():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := _device_syncs(p.read_text()))}
    assert found == {}, ("device-wide syncs (sync the stream instead: "
                         f"torch.cuda.current_stream(device).synchronize()): {found}")
