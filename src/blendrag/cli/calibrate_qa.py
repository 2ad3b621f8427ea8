"""`blendrag calibrate --qa FILE`: calibrate on answer quality against gold answers
(``blendrag.calibration.qa_run``): the smallest ratio whose mean answer quality stays within
``--margin`` of full prefill's at its ``--confidence`` bound, kept in the store as a
same-answer calibration is (the default ``BlendConfig()`` of every engine on it runs it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blendrag.eval.metrics import METRICS, speedup_words


def add_qa_options(p: argparse.ArgumentParser) -> None:
    """The answer-quality target's options (``QualityTarget``)."""
    p.add_argument("--qa", type=Path, metavar="FILE",
                   help="calibrate on answer quality instead: labelled questions as JSON lines "
                        "({\"question\", \"answer\" (or a list), \"passages\" (a list; else "
                        "the nearest --per-prompt of --corpus)}); the same-answer options "
                        "then do not apply")
    p.add_argument("--margin", type=float, default=0.05,
                   help="with --qa: how far below full prefill's mean answer quality a ratio's "
                        "may be, at its --confidence bound (default: 0.05)")
    p.add_argument("--confidence", type=float, default=0.90,
                   help="with --qa: the one-sided confidence of that bound (default: 0.9)")
    p.add_argument("--metric", choices=tuple(METRICS), default="contains",
                   help="with --qa: the answer-quality measure, as `bench quality`'s: contains "
                        "(a gold answer occurs in the answer), qa_f1 (token F1 of the first "
                        "line), rouge_l (default: contains)")


def calibrate_qa(args: argparse.Namespace) -> int:
    """0: calibrated and recorded; 2: bad input, said in one ``error:`` line."""
    from blendrag.calibration.qa_file import read_qa
    from blendrag.calibration.quality import QualityTarget
    from blendrag.cli.calibration_io import check_store, passages, record_dict
    from blendrag.cli.options import apply_threads, emit

    try:
        target = QualityTarget(args.margin, args.confidence, args.metric, args.answer_tokens)
        corpus = [] if args.corpus is None else passages(args.corpus, args.glob, args.field)
        if args.per_prompt < 1:
            raise ValueError("--per-prompt must be >= 1")
        items = read_qa(args.qa, corpus, args.per_prompt)
        if not args.ratios or any(not 0 < r <= 1 for r in args.ratios):
            raise ValueError("--ratios must be fractions in (0, 1]")
        check_store(args)
        apply_threads(args)
        record, path = run(args, items, corpus, target)
    except (ValueError, OSError, ImportError) as exc:
        print(f"blendrag calibrate: error: {exc}", file=sys.stderr)
        return 2
    emit(args, record_dict(record), report(record, path, str(args.qa), len(items)))
    return 0


def run(args: argparse.Namespace, items, corpus: list[str], target, engine=None):
    """Calibrate on ``items`` (on ``engine``, or one loaded from the arguments on the store at
    ``--store-dir``) and keep the record there; (the record, the file written). The record's
    corpus is ``--corpus``'s, else the questions' passages'."""
    from blendrag.calibration.qa_run import SavedQuestions, calibrate_qa
    from blendrag.calibration.quality import MIN_QUESTIONS
    from blendrag.cli.calibration_io import keep_record, opened, saving
    from blendrag.cli.progress import Progress
    from blendrag.store.calibration import corpus_id

    texts = corpus or list(dict.fromkeys(p for item in items for p in item.passages))
    if not args.no_progress:
        measured = [r for r in args.ratios if r < 1.0]
        budget = "no time limit" if not args.budget else f"a budget of {args.budget:g} s"
        few = (f" (fewer than {MIN_QUESTIONS}: no bound, only ratio 1.0 can be chosen)"
               if len(items) < MIN_QUESTIONS else "")
        print(f"calibrate: {len(items)} questions{few} x {len(measured) * len(args.selectors)} "
              f"ratios measured (ratio 1.0 is a full prefill's rows: not measured); "
              f"{target.words}; {budget}", file=sys.stderr)
    with opened(args, engine) as engine:
        saved: list[SavedQuestions] = []
        keep = saving(SavedQuestions, engine, saved)
        record = calibrate_qa(engine, items, target, corpus=corpus_id(texts),
                              ratios=args.ratios, selectors=args.selectors, flow=args.flow,
                              on_question=Progress("calibrating", unit="questions",
                                                   enabled=not args.no_progress),
                              budget_s=args.budget or None, saved=keep)
        return record, keep_record(engine, record, saved)


def report(record, path: Path | None, qa: str, asked: int) -> str:
    """The frontier and the choice, in words (``blendrag calibrate``'s report for ``--qa``)."""
    from blendrag.cli.calibration_io import report_tail

    t = record.target
    fewer = (f" (the time budget allowed {record.prompts} of the {asked})"
             if record.prompts < asked else "")
    conf = f"({t['confidence']:.0%} bound)"
    lines = [f"Ran: {record.flow}",
             f"questions: {qa} ({record.prompts} questions{fewer}, passages id "
             f"{record.corpus[:12]}); took {record.seconds:.0f} s",
             f"answer quality: {t['metric']} against the gold answers, answers of "
             f"{t['answer_tokens']} tokens; full prefill's mean {t['full_quality']:.2f}",
             f"{'selector':<12}{'ratio':>7}{'quality':>9}{'vs full':>9}{conf:>14}"
             f"{'same answer':>13}{'TTFT vs full':>14}"]
    for p in record.frontier:
        bound = "-" if p.quality_bound is None else f"{p.quality_bound:+.2f}"
        note = "  (a full prefill: not measured)" if p.ratio >= 1.0 else ""
        quality = p.quality if p.quality is not None else float("nan")
        lines.append(f"{p.selector:<12}{p.ratio:>7.2f}{quality:>9.2f}"
                     f"{quality - t['full_quality']:>+9.2f}{bound:>14}{p.same_answer:>13.2f}"
                     f"{p.speedup:>13.2f}x{note}")
    target = (f"answer quality ({t['metric']}) at most {t['margin']:g} below full prefill's "
              f"at its {t['confidence']:.0%} bound")
    chosen = record.point()
    if chosen is None:
        lines.append(f"no ratio tried meets the target ({target}): the default config will run "
                     "a full prefill (exact); try larger ratios, more questions or a larger "
                     "--margin")
    else:
        lines.append(f"chosen: {chosen.selector} at {chosen.ratio:g} (quality "
                     f"{t['quality']:.2f} against full prefill's {t['full_quality']:.2f}, "
                     f"difference bound {t['bound']:+.2f} >= -{t['margin']:g}; TTFT "
                     f"{speedup_words(chosen.speedup)}); target met: {target}")
    return "\n".join(lines + report_tail(chosen, path))
