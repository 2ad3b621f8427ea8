"""Does a calibration generalise? ``blendrag bench calibration``.

A dataset's items are split in two halves (alternately). The calibration runs as
``blendrag calibrate`` does, on the passages of the first half alone (prompts of a few
passages and a generic question, no labels), and picks the cheapest ratio meeting each target;
the chosen ratio is then measured on the dataset's own questions over the second half's
passages. A calibration generalises when the held-out share of answers equal to full
prefill's is within 0.05 of the target's. Two targets are read off the same answers: whole
answers of ``answer_tokens`` tokens, and their first sentences; the default ratio (0.20) is
measured on the held-out half beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from blendrag.calibration.flows import make_flow
from blendrag.calibration.prompts import make_prompts
from blendrag.calibration.run import (
    RATIOS,
    answer,
    choose,
    frontier,
    model_questions,
    parts_of,
)
from blendrag.calibration.target import CalibrationTarget
from blendrag.config import DEFAULT_RATIO, DEFAULT_SELECTOR
from blendrag.engine.engine import BlendEngine
from blendrag.store.calibration import FrontierPoint
from blendrag_bench.named_datasets import load_dataset

MARGIN = 0.05  # held-out same answer may fall this far below the target's


@dataclass(frozen=True)
class CalibrationBenchConfig:
    dataset: str = "synthetic"
    items: int = 40
    prompts: int = 24
    per_prompt: int = 4
    ratios: tuple[float, ...] = RATIOS
    same_answer: float = 0.90
    answer_kl: float = 0.02
    answer_tokens: int = 32
    flow: str = "engine"
    questions: str = "generic"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.items < 4 or self.prompts < 1:
            raise ValueError("--items must be >= 4 and --prompts >= 1")


def run(engine: BlendEngine, cfg: CalibrationBenchConfig,
        on_step: Callable[[str, int, int], None] | None = None) -> dict:
    """The calibration on the first half, each target's choice, and the choices and the
    default measured on the second half's own questions."""
    step = on_step or (lambda phase, done, total: None)
    items = load_dataset(cfg.dataset, limit=cfg.items)
    first, second = items[0::2], items[1::2]
    corpus = list(dict.fromkeys(c for item in first for c in item.chunks))
    runs = make_flow(cfg.flow, engine)
    made = make_prompts(corpus, cfg.prompts, cfg.per_prompt, cfg.seed,
                        ask=model_questions(engine) if cfg.questions == "model" else None)
    t0 = time.perf_counter()
    rows = answer(engine, runs, [parts_of(p, first[0].prefix) for p in made], cfg.ratios,
                  (DEFAULT_SELECTOR,), cfg.answer_tokens,
                  lambda done, total: step("calibration", done, total))
    took = time.perf_counter() - t0
    targets = {"whole answer": CalibrationTarget(cfg.same_answer, cfg.answer_kl,
                                                 cfg.answer_tokens),
               "first sentence": CalibrationTarget(cfg.same_answer, cfg.answer_kl,
                                                   cfg.answer_tokens, first_sentence=True)}
    chosen = {name: choose(frontier(rows, t.first_sentence), t)[1] for name, t in
              targets.items()}
    # every ratio held out too: how well each calibrated point predicts the held-out one
    checked = sorted({*cfg.ratios, DEFAULT_RATIO})
    held = answer(engine, runs, second, checked, (DEFAULT_SELECTOR,), cfg.answer_tokens,
                  lambda done, total: step("held-out", done, total))
    out: dict = {"dataset": cfg.dataset, "items": len(items), "corpus_passages": len(corpus),
                 "calibration_prompts": len(made), "calibration_s": took, "flow": runs.describe(),
                 "questions": [p.question for p in made],
                 "config": asdict(cfg), "targets": {}}
    for name, target in targets.items():
        cal = frontier(rows, target.first_sentence)
        test = {p.ratio: p for p in frontier(held, target.first_sentence)}
        ratio = chosen[name]
        point = test.get(ratio) if ratio is not None else None
        out["targets"][name] = {
            "ratio": ratio, "calibration_frontier": [asdict(p) for p in cal],
            "held_out_frontier": [asdict(p) for p in test.values()],
            "held_out": None if point is None else asdict(point),
            "held_out_default": asdict(test[DEFAULT_RATIO]),
            "generalises": None if point is None else bool(
                point.same_answer >= target.same_answer - MARGIN if target.same_answer
                is not None else True)}
    return out


def format_report(result: dict) -> str:
    lines = [f"Ran: {result['flow']}",
             f"dataset {result['dataset']}: {result['items']} items; calibrated on the first "
             f"half's {result['corpus_passages']} passages ({result['calibration_prompts']} "
             f"prompts, {result['config']['questions']} questions, "
             f"{result['calibration_s']:.0f} s), checked on the second half's "
             f"{result['items'] // 2} questions"]
    for name, t in result["targets"].items():
        lines.append(f"\ntarget: {name} (same answer >= {result['config']['same_answer']:g}, "
                     f"answer KL <= {result['config']['answer_kl']:g})")
        lines.append(f"  {'ratio':>6}{'same (cal.)':>13}{'KL (cal.)':>11}{'TTFT':>8}"
                     f"{'same (held)':>13}{'KL (held)':>11}{'TTFT':>8}")
        held = {p["ratio"]: p for p in t["held_out_frontier"]}
        for p in t["calibration_frontier"]:
            h = held[p["ratio"]]
            lines.append(f"  {p['ratio']:>6.2f}{p['same_answer']:>13.2f}{p['answer_kl']:>11.4f}"
                         f"{p['speedup']:>7.2f}x{h['same_answer']:>13.2f}{h['answer_kl']:>11.4f}"
                         f"{h['speedup']:>7.2f}x")
        d = t["held_out_default"]
        default = (f"the default {DEFAULT_RATIO:g} held out: same answer "
                   f"{d['same_answer']:.2f}, answer KL {d['answer_kl']:.4f}, {d['speedup']:.2f}x")
        if t["ratio"] is None:
            lines.append(f"  chosen: none (no ratio tried meets the target); {default}")
            continue
        h = FrontierPoint(**t["held_out"])
        verdict = "generalises" if t["generalises"] else "does NOT generalise"
        lines.append(f"  chosen: {t['ratio']:g}; held out: same answer {h.same_answer:.2f}, "
                     f"answer KL {h.answer_kl:.4f}, TTFT {h.speedup:.2f}x: {verdict} "
                     f"(within {MARGIN:g} of the target); {default}")
    return "\n".join(lines)
