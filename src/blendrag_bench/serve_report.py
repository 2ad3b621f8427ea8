"""`blendrag bench serve`'s figures: what one served request records as its user sees it
(``Served``), a run's row (throughput, latency percentiles and the parts of the time to first
token, each against the one-at-a-time baseline, answers as alone) and that row in words.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Served:
    """One request as its user saw it."""

    arrived: float
    first: float = 0.0
    last: float = 0.0
    tokens: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # seconds between two text deltas
    opening: bool = False  # a closed-loop user's first request (all users start at once)
    queued: float = 0.0  # seconds until the scheduler admitted it (ServedRequest.queued_s)
    work: float = 0.0  # seconds of its prefill's own work (TimingStats.work_s)

    @property
    def ttft(self) -> float:
        return self.first - self.arrived

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first."""
        return (self.last - self.first) / max(1, len(self.tokens) - 1)


def summary(name: str, served: list[Served], wall: float, base: list[Served] | None,
            base_wall: float | None, want: list[list[int]] | None) -> dict:
    """One row: throughput, latencies, and each against the baseline."""
    tokens = sum(len(s.tokens) for s in served)
    row = {"run": name, "requests": len(served), "wall_s": wall,
           "requests_per_s": len(served) / wall, "tokens_per_s": tokens / wall,
           "ttft_p50_s": _pct([s.ttft for s in served], 50),
           "ttft_p95_s": _pct([s.ttft for s in served], 95),
           "tpot_p50_s": _pct([s.tpot for s in served], 50),
           "tpot_p95_s": _pct([s.tpot for s in served], 95)}
    later = [s for s in served if not s.opening]
    if later and len(later) < len(served):  # past the opening burst: users in their own rhythm
        row["ttft_p95_later_s"] = _pct([s.ttft for s in later], 95)
        if base is not None:
            row["ttft_p95_later_x"] = row["ttft_p95_later_s"] / _pct([s.ttft for s in base], 95)
    # where the time to first token goes (past the burst where there is one): waiting to be
    # admitted, the prefill's own work, and the rest (waiting for the device beside the others'
    # work, handing the first token out)
    parts = later or served
    row["queued_p95_s"] = _pct([s.queued for s in parts], 95)
    row["work_p95_s"] = _pct([s.work for s in parts], 95)
    row["rest_p95_s"] = _pct([s.ttft - s.queued - s.work for s in parts], 95)
    gaps = [g for s in served for g in s.gaps]
    if gaps:  # the longest waits a reader saw between two pieces of text
        row["gap_p99_s"], row["gap_max_s"] = _pct(gaps, 99), max(gaps)
    if base is not None and base_wall is not None:  # requests/s: runs of other lengths
        row["throughput_x"] = row["requests_per_s"] / (len(base) / base_wall)
        row["ttft_p95_x"] = row["ttft_p95_s"] / _pct([s.ttft for s in base], 95)
        row["tpot_p50_x"] = _pct([s.tpot for s in base], 50) / row["tpot_p50_s"]
    if want is not None:
        row["same_answer"] = sum(s.tokens == w for s, w in zip(served, want))
        # where answers part (bf16 on random weights: batches of other sizes round otherwise)
        agree = [_agreeing(s.tokens, w) for s, w in zip(served, want)]
        row["same_first"] = sum(a >= 1 for a in agree)
        row["agreeing_p50"] = statistics.median(agree) if agree else 0
    return row


def _agreeing(got: list[int], want: list[int]) -> int:
    """Leading tokens two answers share."""
    n = 0
    for a, b in zip(got, want):
        if a != b:
            break
        n += 1
    return n


def _pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def format_row(row: dict) -> str:
    line = (f"{row['mode']:<8} {row['run']:<14} {row['requests_per_s']:7.3f} req/s "
            f"{row['tokens_per_s']:7.1f} tok/s  TTFT p50 {row['ttft_p50_s'] * 1e3:7.0f} ms "
            f"p95 {row['ttft_p95_s'] * 1e3:7.0f} ms  TPOT p50 {row['tpot_p50_s'] * 1e3:6.1f} ms "
            f"p95 {row['tpot_p95_s'] * 1e3:6.1f} ms")
    if "throughput_x" in row:
        line += (f"  | throughput {row['throughput_x']:.2f}x, p95 TTFT {row['ttft_p95_x']:.2f}x, "
                 f"tok/s per user {row['tpot_p50_x']:.2f}x, same answer "
                 f"{row['same_answer']}/{row['requests']}")
        if row["same_answer"] < row["requests"]:
            line += (f" (first token {row['same_first']}/{row['requests']}, "
                     f"{row['agreeing_p50']:g} leading tokens the same at the median)")
    if "ttft_p95_later_x" in row:
        line += f", after each user's first: p95 TTFT {row['ttft_p95_later_x']:.2f}x"
    if "queued_p95_s" in row:
        line += (f"  | TTFT parts p95: queued {row['queued_p95_s'] * 1e3:.0f} ms, prefill work "
                 f"{row['work_p95_s'] * 1e3:.0f} ms, the rest {row['rest_p95_s'] * 1e3:.0f} ms")
    if "gap_max_s" in row:
        line += (f"  | gap between deltas p99 {row['gap_p99_s'] * 1e3:.0f} ms, max "
                 f"{row['gap_max_s'] * 1e3:.0f} ms")
    if "mean_batch" in row:
        line += f", {row['mean_batch']:.1f} requests a step, {row['packed']} prefills packed"
    if "cores_busy" in row:
        line += f", cores {row['cores_busy']:.0%} busy"
    return line
