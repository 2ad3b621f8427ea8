"""Fidelity on your own model and prompts: the frontier, and the smallest ratio that meets a
fidelity you choose.

How close blend stays to full prefill depends on the model (docs/benchmarks.md shows two
models apart by a factor of two in answer KL at the same ratio), so check it before trusting
it. ``check_fidelity`` runs full prefill, full KV reuse and every selector at every ratio on a
few of your prompts, compares each whole greedy answer with full prefill's (same answer, answer
KL: ``blendrag.eval.answer``), and reports per selector the smallest ratio whose prompts meet
the ``FidelityTarget``. ``blendrag bench fidelity --prompts FILE`` does the same from the
command line.

The check runs what your application runs (``blendrag_bench.flows``), and its report says
which: ``flow="integration"`` (the default) is LangChain's and LlamaIndex's ``BlendLLM``, whose
prompts are ``prefix + "\n\n".join(chunks) + suffix`` and whose chunk KVs are computed after the
engine's ``chunk_prefix`` (``""`` unless you set another); ``flow="engine"`` is
``engine.ingest(chunks, prefix=prefix)`` + ``engine.build_prompt(prefix, chunks, suffix)``.
Both compute chunks in the engine's ingestion context.

A prompts file is JSON lines, one prompt each: ``{"prefix": ..., "chunks": [...], "suffix":
...}`` (the pieces as your application builds them; ``prefix`` may be left out), optionally with
``"answers": [...]`` to score answer quality too: the share of answers that contain a gold
answer (the ``contains`` metric).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from blendrag.config import DEFAULT_BLEND
from blendrag.engine.engine import BlendEngine
from blendrag.eval.metrics import speedup_words
from blendrag_bench.datasets import EvalItem
from blendrag_bench.flows import make_flow
from blendrag_bench.quality import ConfigSummary, QualityConfig, QualityReport, run_quality
from blendrag_bench.ratios import DEFAULT_FIDELITY_RATIOS


@dataclass(frozen=True)
class FidelityTarget:
    """What "faithful" means to you: at least ``same_answer`` of the prompts get full
    prefill's answer, and the answer KL (mean over prompts) is at most ``answer_kl``."""

    same_answer: float = 0.90
    answer_kl: float = 0.02

    def __post_init__(self) -> None:
        if not 0.0 <= self.same_answer <= 1.0 or math.isnan(self.same_answer):
            raise ValueError(f"same_answer must be in [0, 1], got {self.same_answer!r}")
        if not self.answer_kl >= 0.0:
            raise ValueError(f"answer_kl must be >= 0, got {self.answer_kl!r}")

    def met(self, summary: ConfigSummary) -> bool:
        return summary.same_answer >= self.same_answer and summary.answer_kl <= self.answer_kl

    @property
    def words(self) -> str:
        return f"same answer >= {self.same_answer:.2f} and answer KL <= {self.answer_kl:g}"


@dataclass(frozen=True)
class FidelityCheck:
    """The frontier (``report``) and, per selector, the smallest ratio meeting ``target``
    (None: no ratio tried meets it)."""

    report: QualityReport
    target: FidelityTarget
    smallest: dict[str, float | None]

    def lines(self) -> list[str]:
        """One line per selector: its smallest ratio meeting the target, with its figures."""
        out = [f"Smallest ratio meeting {self.target.words} ({self.report.items} prompts):"]
        by_label = {(s.selector, s.ratio): s for s in self.report.summaries}
        for selector, ratio in self.smallest.items():
            if ratio is None:
                tried = sorted(r for (sel, r) in by_label if sel == selector and r is not None)
                out.append(f"  {selector}: none of the ratios tried "
                           f"({', '.join(f'{r:g}' for r in tried)}); use full prefill or try "
                           "larger ratios")
                continue
            s = by_label[(selector, ratio)]
            out.append(f"  {selector}: {ratio:g} (same answer {s.same_answer:.2f}, answer KL "
                       f"{s.answer_kl:.4f}, compute {s.compute_fraction:.2f} of full's, "
                       f"TTFT {speedup_words(s.speedup_vs_full)})")
        return out


def smallest_ratios(report: QualityReport, target: FidelityTarget) -> dict[str, float | None]:
    """Per selector in ``report``, the smallest ratio whose summary meets ``target``."""
    out: dict[str, float | None] = {}
    for s in sorted(report.summaries, key=lambda s: s.ratio or 0.0):
        if s.selector is None:
            continue
        if out.get(s.selector) is None:
            out[s.selector] = s.ratio if target.met(s) else None
    return out


def check_fidelity(engine: BlendEngine, items: Sequence[EvalItem],
                   selectors: Sequence[str] = (DEFAULT_BLEND.selector,),
                   ratios: Sequence[float] = DEFAULT_FIDELITY_RATIOS,
                   target: FidelityTarget = FidelityTarget(),
                   max_new_tokens: int = 16,
                   on_item: Callable[[int, int], None] | None = None, *,
                   flow: str = "integration", model: str | None = None) -> FidelityCheck:
    """Run full prefill, reuse and blend (each selector at each ratio) on ``items`` with
    ``engine``, laid out and ingested as ``flow`` does (``blendrag_bench.flows.FLOWS``), and
    find the smallest ratio meeting ``target`` per selector; ``on_item(done, total)`` after
    each prompt. ``model``: the model's name in the report (default: the engine's)."""
    config = QualityConfig(model=model or engine.name, modes=("full", "reuse", "blend"),
                           selectors=tuple(selectors), ratios=tuple(ratios),
                           max_new_tokens=max_new_tokens, max_chunk_tokens=None)
    runs = make_flow(flow, engine, profile="profile" in config.selectors)
    report = run_quality(items, config, engine=engine, dataset="your prompts", on_item=on_item,
                         flow=runs)
    return FidelityCheck(report, target, smallest_ratios(report, target))


def answer_lines(report: QualityReport) -> list[str]:
    """Every config's answer to every prompt evaluated (``--show-answers``), after the prompt's
    question (its suffix) and gold answers."""
    out = ["Answers:"]
    for i, item in enumerate(report.used):
        gold = f"; gold: {' | '.join(item.answers)}" if item.answers else ""
        out.append(f"prompt {i + 1}: {item.suffix.strip()!r}{gold}")
        for e in (e for e in report.examples if e.item == i):
            label = e.config.mode if e.config.mode != "blend" else (
                f"blend-{e.config.selector}@{e.config.ratio:g}")
            same = "" if e.config.mode == "full" else (
                "  (= full)" if e.same_answer else "  (differs from full)")
            out.append(f"  {label}: {e.answer!r}{same}")
    return out


def load_prompts(path: str | Path, limit: int | None = None) -> list[EvalItem]:
    """The prompts of a JSON-lines file (see the module docstring); ValueError naming the line
    of a malformed one."""
    path = Path(path)
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            answers = record.get("answers", ())
            items.append(EvalItem(record.get("prefix", ""), tuple(record["chunks"]),
                                  record["suffix"],
                                  (answers,) if isinstance(answers, str) else tuple(answers),
                                  kind="prompt", metric="contains"))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"{path}:{number}: not a prompt {{prefix, chunks: [...], suffix, "
                             f"answers?}}: {e}") from e
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise ValueError(f"{path}: no prompt in the file")
    return items
