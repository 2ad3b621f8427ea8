"""`blendrag bench calibration`: does a calibration generalise, calibrated on half a dataset's
passages and checked on the other half's questions (``calibration_bench.py``).
``blendrag_bench.cli`` adds it to the ``bench`` group."""

from __future__ import annotations

import argparse
import sys

from blendrag.cli.options import add_json_option, add_model_options, add_progress_option


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``calibration`` to the ``blendrag bench`` group."""
    cal = bench.add_parser(
        "calibration", help="does a calibration generalise: calibrate on half a dataset's "
                            "passages, check the ratio on the other half's questions",
        description="Calibrate (as `blendrag calibrate` does, generic questions, no labels) on "
                    "the passages of half a dataset's items, then measure the chosen ratio and "
                    "the default on the other half's own questions; two targets (whole answers, "
                    "first sentences) read off the same answers.")
    add_model_options(cal)
    cal.add_argument("--dataset", default="synthetic",
                     help="synthetic, longfacts, musique or a file (default: synthetic)")
    cal.add_argument("--items", type=int, default=40,
                     help="dataset items, half for calibrating, half held out (default: 40)")
    cal.add_argument("--prompts", type=int, default=24,
                     help="calibration prompts (default: 24)")
    cal.add_argument("--per-prompt", type=int, default=4,
                     help="passages in each calibration prompt (default: 4)")
    cal.add_argument("--same-answer", type=float, default=0.9,
                     help="the target's share of answers equal to full's (default: 0.9)")
    cal.add_argument("--answer-kl", type=float, default=0.02,
                     help="the target's mean answer KL (default: 0.02)")
    cal.add_argument("--answer-tokens", type=int, default=32,
                     help="tokens of each answer (default: 32)")
    cal.add_argument("--questions", choices=("generic", "model"), default="generic",
                     help="the calibration's questions: generic, or written by the model "
                          "(default: generic)")
    add_progress_option(cal)
    add_json_option(cal, "the result")
    cal.set_defaults(func=_calibration)


def _calibration(args: argparse.Namespace) -> int:
    from blendrag.cli.options import apply_threads, emit, engine_spec
    from blendrag.cli.progress import Progress
    from blendrag_bench.calibration_bench import CalibrationBenchConfig, format_report, run

    try:
        cfg = CalibrationBenchConfig(args.dataset, args.items, args.prompts, args.per_prompt,
                                     same_answer=args.same_answer, answer_kl=args.answer_kl,
                                     answer_tokens=args.answer_tokens, questions=args.questions)
    except ValueError as exc:
        print(f"blendrag bench calibration: error: {exc}", file=sys.stderr)
        return 2
    apply_threads(args)
    engine = engine_spec(args).build()
    bars: dict[str, Progress] = {}

    def step(phase: str, done: int, total: int) -> None:
        bar = bars.setdefault(phase, Progress(phase, unit="prompts",
                                              enabled=not args.no_progress))
        bar(done, total)

    result = run(engine, cfg, step)
    emit(args, result, format_report(result))
    return 0
