"""Stored K/V formats in ``blendrag bench store``: per format (``StoreConfig.kv_format``), the
bytes per token of one stored entry against the float32 KV formula, and how fast it is encoded
and loaded (decoded back to the model's dtype, checksums verified), in GB/s of the model-dtype
rows it carries (1e9 bytes per second), median of ``repeats``. What a format does to answers
is measured by ``scripts/measure_kv_formats.py`` (docs/benchmarks.md, "Stored KV formats")."""

from __future__ import annotations

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import codec
from blendrag.store.config import KV_FORMATS, StoreConfig
from blendrag_bench.timing import median_time

DEFAULT_FORMAT = StoreConfig.kv_format  # the dataclass field's default


def measure(kv: ChunkKV, key: str, repeats: int) -> list[dict]:
    """One record per format: ``format``, ``bytes_per_token``, ``bytes_vs_model``,
    ``encode_gbps``, ``load_gbps``, ``default``, ``kl_vs_uncompressed`` (None here: set by
    ``format_kl.py`` when asked for)."""
    rows = kv.keys.numel() * kv.keys.element_size() * 2  # the rows a read hands back
    exact = len(codec.encode(key, kv))
    out = []
    for kv_format in KV_FORMATS:
        encode_s, data = median_time(lambda f=kv_format: codec.encode(key, kv, f), repeats)
        load_s = median_time(lambda d=data: codec.decode(d, key), repeats).seconds
        out.append({"format": kv_format, "bytes_per_token": len(data) / kv.num_tokens,
                    "bytes_vs_model": len(data) / exact, "encode_gbps": rows / encode_s / 1e9,
                    "load_gbps": rows / load_s / 1e9, "default": kv_format == DEFAULT_FORMAT,
                    "kl_vs_uncompressed": None})
    return out


def format_lines(records: list[dict]) -> list[str]:
    lines = [f"{'stored as':<10}{'bytes/token':>12}{'vs model':>10}{'encode GB/s':>13}"
             f"{'load GB/s':>11}{'KL vs exact':>13}"]
    for r in records:
        mark = "  (default)" if r["default"] else ""
        kl = r["kl_vs_uncompressed"]
        kl_text = "-" if kl is None else f"{kl:.6f}"
        lines.append(f"{r['format']:<10}{r['bytes_per_token']:>12.1f}{r['bytes_vs_model']:>10.3f}"
                     f"{r['encode_gbps']:>13.2f}{r['load_gbps']:>11.2f}{kl_text:>13}{mark}")
    return lines
