"""`blendrag calibrate`: the smallest recompute ratio whose whole answers stay full prefill's on
your model and your passages, measured as your application runs it and kept beside the store,
where the default ``BlendConfig()`` of every engine on that store finds it
(``blendrag.calibration``). ``blendrag precompute --calibrate`` runs it after ingesting."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blendrag.calibration import FLOWS
from blendrag.calibration.target import lower_bound
from blendrag.cli.calibrate_qa import add_qa_options, calibrate_qa
from blendrag.cli.calibration_io import (
    check_store,
    keep_record,
    opened,
    passages,
    record_dict,
    report_tail,
    saving,
)
from blendrag.cli.options import (
    add_chat_option,
    add_json_option,
    add_model_options,
    add_namespace_options,
    add_progress_option,
    add_store_dir_option,
    apply_threads,
    emit,
)
from blendrag.eval.metrics import speedup_words

RATIOS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
DEFAULT_BUDGET_S = 540.0  # 9 minutes: with loading the model, the command ends within 10


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` command."""
    p = subparsers.add_parser(
        "calibrate", help="the smallest ratio whose answers stay full prefill's, on your "
                          "model and passages; kept in the store for the default config",
        description="Build prompts from your own passages (a few in a random order, then a "
                    "question), answer each with full prefill and with blend at every ratio, "
                    "as your application runs them, and record in the store the smallest "
                    "ratio meeting the target: the default BlendConfig() of an engine on "
                    "that store then runs it. No labels needed; with --qa FILE, labelled "
                    "questions instead: the smallest ratio whose answer quality stays within "
                    "--margin of full prefill's.")
    add_model_options(p)
    add_store_dir_option(p)
    add_namespace_options(p)
    p.add_argument("--corpus", type=Path,
                   help="your passages: a folder (one passage per file matching --glob) or a "
                        "JSON-lines file (one per line, under --field); needed unless --qa "
                        "gives every question its passages")
    p.add_argument("--glob", default="*.txt", help="file pattern under a --corpus folder "
                                                   "(default: *.txt)")
    p.add_argument("--field", default="text",
                   help="JSONL field holding a passage (default: text)")
    add_target_options(p)
    add_qa_options(p)
    add_calibration_options(p)
    add_chat_option(p)
    add_progress_option(p)
    add_json_option(p, "the calibration record")
    p.set_defaults(func=_calibrate)


def add_target_options(p: argparse.ArgumentParser) -> None:
    """The fidelity target's options (``CalibrationTarget``)."""
    p.add_argument("--same-answer", type=float, default=0.9,
                   help="share of answers that must equal full prefill's; -1: not asked "
                        "(default: 0.9)")
    p.add_argument("--answer-kl", type=float, default=0.02,
                   help="mean answer KL against full prefill's answer at most; -1: not asked "
                        "(default: 0.02)")
    p.add_argument("--answer-tokens", type=int, default=32,
                   help="tokens of each answer compared (default: 32)")
    p.add_argument("--first-sentence", action="store_true",
                   help="compare the answers' first sentences (default: the whole answers)")


def add_calibration_options(p: argparse.ArgumentParser) -> None:
    """How the calibration runs (prompts, ratios, selectors, flow)."""
    p.add_argument("--prompts", type=int, default=24,
                   help="prompts made from the passages (default: 24)")
    p.add_argument("--per-prompt", type=int, default=4,
                   help="passages in each prompt (default: 4)")
    p.add_argument("--ratios", type=_floats, default=RATIOS,
                   help="ratios tried, comma-separated (default: "
                        + ",".join(f"{r:g}" for r in RATIOS) + ")")
    p.add_argument("--selectors", type=lambda t: tuple(t.split(",")), default=("preview",),
                   help="selectors tried, comma-separated (default: preview)")
    p.add_argument("--flow", choices=FLOWS, default=FLOWS[0],
                   help="how prompts are laid out and chunks stored: integration (LangChain's "
                        "and LlamaIndex's BlendLLM) or engine (BlendEngine.ingest + "
                        "build_prompt) (default: integration)")
    p.add_argument("--chunk-prefix", default="",
                   help="the engine's chunk prefix, as your application's BlendEngine(chunk_"
                        "prefix=...) (default: \"\", the framework LLMs')")
    p.add_argument("--questions", choices=("generic", "model"), default="generic",
                   help="questions from a fixed generic set, or written by the model about one "
                        "passage of each prompt (a chat model) (default: generic)")
    p.add_argument("--seed", type=int, default=0, help="prompts' draw (default: 0)")
    p.add_argument("--budget", type=duration, default=DEFAULT_BUDGET_S, metavar="TIME",
                   help="time the measuring may take, e.g. 10m, 90s, 1h; 0: no limit. Fewer "
                        "prompts when they do not fit (said in the report); progress is kept "
                        "prompt by prompt in the store, and the same command run again goes "
                        "on from it (default: 9m, so that the whole command ends within 10 "
                        "minutes)")


def target_from(args: argparse.Namespace):
    from blendrag.calibration.target import CalibrationTarget

    return CalibrationTarget(None if args.same_answer < 0 else args.same_answer,
                             None if args.answer_kl < 0 else args.answer_kl,
                             args.answer_tokens, args.first_sentence)


def _calibrate(args: argparse.Namespace) -> int:
    """0: calibrated and recorded; 2: bad input, said in one ``error:`` line."""
    if args.qa is not None:
        return calibrate_qa(args)
    try:
        if args.corpus is None:
            raise ValueError("give --corpus (your passages), or --qa (labelled questions)")
        target = target_from(args)
        texts = passages(args.corpus, args.glob, args.field)
        check_inputs(args, texts)
        apply_threads(args)
        record, path = run(args, texts, target)
    except (ValueError, OSError, ImportError) as exc:
        print(f"blendrag calibrate: error: {exc}", file=sys.stderr)
        return 2
    emit(args, record_dict(record), report(record, path, str(args.corpus), len(texts),
                                           args.prompts))
    return 0


def check_inputs(args: argparse.Namespace, texts: list[str]) -> None:
    """ValueError before any model work: too few passages, a store folder that cannot be
    written, a calibration that cannot run."""
    from blendrag.calibration.prompts import make_prompts

    if args.prompts < 1 or args.per_prompt < 1:
        raise ValueError("--prompts and --per-prompt must be >= 1")
    if not args.ratios or any(not 0 < r <= 1 for r in args.ratios):
        raise ValueError("--ratios must be fractions in (0, 1] (a ratio of 0 recomputes "
                         "nothing: a reuse, not a calibrated blend)")
    make_prompts(texts, 1, args.per_prompt)  # too few passages: said here
    check_store(args)


def run(args: argparse.Namespace, texts: list[str], target, engine=None):
    """Calibrate (on ``engine``, or on one loaded from the arguments with a disk store at
    ``--store-dir``, in ``--namespace``, signed with ``--store-keys``) and keep the record in
    the store's namespace, where its engines read it; (the record, the file written)."""
    from blendrag.calibration.plan import PromptPlan
    from blendrag.calibration.run import calibrate
    from blendrag.calibration.saved import SavedProgress
    from blendrag.cli.progress import Progress

    with opened(args, engine) as engine:
        plan = PromptPlan(target, args.prompts, args.ratios, args.selectors)
        if not args.no_progress:
            budget = "no time limit" if not args.budget else f"a budget of {args.budget:g} s"
            print(f"calibrate: {plan.words()}; {budget}", file=sys.stderr)
        bar = Progress("calibrating", unit="prompts", enabled=not args.no_progress)
        saved: list[SavedProgress] = []
        keep = saving(SavedProgress, engine, saved)
        record = calibrate(engine, texts, target, prompts=args.prompts,
                           per_prompt=args.per_prompt, ratios=args.ratios,
                           selectors=args.selectors, flow=args.flow, seed=args.seed,
                           questions=args.questions, on_prompt=bar,
                           budget_s=args.budget or None, saved=keep)
        return record, keep_record(engine, record, saved)


def report(record, path: Path | None, corpus: str, passages: int,
           asked: int | None = None) -> str:
    """The frontier and the choice, in words; ``asked``: the prompts asked for (the report
    says when the budget allowed fewer)."""
    fewer = (f" (the time budget allowed {record.prompts} of the {asked} asked for)"
             if asked is not None and record.prompts < asked else "")
    lines = [f"Ran: {record.flow}",
             f"corpus: {corpus} ({passages} passages, id {record.corpus[:12]}); "
             f"{record.prompts} prompts{fewer}; took {record.seconds:.0f} s",
             f"{'selector':<12}{'ratio':>7}{'same answer':>13}{'(90 % bound)':>14}"
             f"{'answer KL':>11}{'TTFT vs full':>14}{'prompts':>9}"]
    for p in record.frontier:
        bound = f"{lower_bound(p.same_answer, p.prompts):.2f}" if p.prompts else "-"
        note = "  (a full prefill: not measured)" if p.ratio >= 1.0 else (
            "  (dropped: could not meet the target)" if p.prompts < record.prompts else "")
        lines.append(f"{p.selector:<12}{p.ratio:>7.2f}{p.same_answer:>13.2f}{bound:>14}"
                     f"{p.answer_kl:>11.4f}{p.speedup:>13.2f}x{p.prompts:>9}{note}")
    t = record.target
    target = ", ".join([*([f"same answer >= {t['same_answer']:g}"] if t["same_answer"] is not None
                          else []),
                        *([f"answer KL <= {t['answer_kl']:g}"] if t["answer_kl"] is not None
                          else []),
                        "first sentences" if t["first_sentence"] else
                        f"answers of {t['answer_tokens']} tokens"])
    chosen = record.point()
    if chosen is None:
        lines.append(f"no ratio tried meets the target ({target}): the default config will run "
                     "a full prefill (exact); try larger ratios or a looser target")
    else:
        lines.append(f"chosen: {chosen.selector} at {chosen.ratio:g} (same answer "
                     f"{chosen.same_answer:.2f}, answer KL {chosen.answer_kl:.4f}, TTFT "
                     f"{speedup_words(chosen.speedup)}); target: {target}")
    return "\n".join(lines + report_tail(chosen, path))


def duration(text: str) -> float:
    """A time as seconds: "600", "90s", "10m", "1.5h"; "0": no limit."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time such as 10m, 90s or 1h, got "
                                         f"{text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"a time must be >= 0 and finite, got {text!r}")
    return seconds


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from None
