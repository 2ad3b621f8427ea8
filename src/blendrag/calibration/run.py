"""Calibrate: measure blend's whole answers against full prefill's on prompts made from the
user's own passages, run as the user's application runs them, and pick the cheapest ratio
that meets the target.

Per prompt (``prompts.py``): the passages are stored as the flow stores them (``flows.py``:
the framework LLMs' way or the engine's, with the engine's chunk prefix, chat template and
ingestion context), the prompt laid out as the flow lays it out, and full prefill then each
selector at each ratio answer it (greedy, ``target.answer_tokens`` tokens): same answer and
answer KL against full's (``blendrag.eval.answer``), and the TTFT of each. The frontier is the
mean over prompts per (selector, ratio); the choice, per selector the smallest ratio that meets
the target, then the selector whose choice is fastest.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blendrag.calibration.flows import Flow, flow_settings, make_flow
from blendrag.calibration.plan import EXACT, PromptPlan
from blendrag.calibration.prompts import CalibrationPrompt, make_prompts
from blendrag.calibration.saved import Result, SavedProgress, held
from blendrag.calibration.target import CalibrationTarget
from blendrag.checks import is_finite_number
from blendrag.config import BlendConfig
from blendrag.engine.engine import BlendEngine
from blendrag.eval.answer import compare_answers
from blendrag.eval.metrics import normalize_answer
from blendrag.prompt import PromptLayout
from blendrag.store.calibration import CalibrationRecord, FrontierPoint, corpus_id

RATIOS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
INSTRUCTION = "Read the passages and answer the question.\n\n"
FULL = BlendConfig(mode="full")
DEFAULT_TARGET = CalibrationTarget()
QUESTIONS = ("generic", "model")


@dataclass(frozen=True)
class PromptParts:
    """A calibration prompt as the application builds it."""

    prefix: str
    chunks: tuple[str, ...]
    suffix: str


def parts_of(prompt: CalibrationPrompt, instruction: str = INSTRUCTION) -> PromptParts:
    return PromptParts(instruction, prompt.passages,
                       f"\n\nQuestion: {prompt.question}\nAnswer:")


def calibrate(engine: BlendEngine, passages: Sequence[str],
              target: CalibrationTarget = DEFAULT_TARGET, *, prompts: int = 24,
              per_prompt: int = 4, ratios: Sequence[float] = RATIOS,
              selectors: Sequence[str] = ("preview",), flow: str = "engine", seed: int = 0,
              questions: str = "generic", instruction: str = INSTRUCTION,
              on_prompt: Callable[[int, int], None] | None = None,
              budget_s: float | None = None,
              saved: Callable[[dict], SavedProgress] | None = None) -> CalibrationRecord:
    """The calibration of ``engine`` on ``passages`` (see the module docstring): a record to
    keep (``CalibrationBook.put``) or use at once (``engine.use_calibration``).
    ``flow``: ``engine`` or ``integration`` (``flows.py``); ``questions``: ``generic`` or
    ``model`` (written by the model, ``prompts.py``); ``instruction``: the prompts' prefix;
    ``on_prompt(done, total)`` after each prompt. ``budget_s``: seconds the measuring may take
    (fewer prompts when they do not fit: ``plan.py``); ``saved(settings)``: where progress is
    kept prompt by prompt and taken up again (``saved.py``; the caller removes it once the
    record is kept)."""
    if questions not in QUESTIONS:
        raise ValueError(f"questions must be one of {QUESTIONS}, got {questions!r}")
    check_grid(ratios, selectors)
    t0 = time.perf_counter()
    plan = PromptPlan(target, prompts, ratios, selectors, budget_s)
    corpus = corpus_id(list(passages))
    runs = make_flow(flow, engine, profile="profile" in selectors)
    progress = None if saved is None else saved(
        {"model": engine.model_fp, "tokenizer": engine.tokenizer_fp, "corpus": corpus,
         "per_prompt": per_prompt, "seed": seed, "questions": questions,
         "instruction": instruction, **flow_settings(runs, engine),
         "selectors": list(selectors), "ratios": list(ratios),
         "answer_tokens": target.answer_tokens})
    with held(progress):
        rows = measure_planned(engine, runs, passages, plan, per_prompt, seed, questions,
                               instruction, on_prompt, progress)
    points = frontier(rows, target.first_sentence) + exact_points(plan, len(rows))
    selector, ratio = choose(points, target)
    return CalibrationRecord(
        model=engine.model_fp, tokenizer=engine.tokenizer_fp, corpus=corpus,
        selector=selector, ratio=ratio,
        target={"same_answer": target.same_answer, "answer_kl": target.answer_kl,
                "answer_tokens": target.answer_tokens, "first_sentence": target.first_sentence},
        frontier=tuple(points), flow=runs.describe(), prompts=len(rows),
        seconds=time.perf_counter() - t0)


def check_grid(ratios: Sequence[float], selectors: Sequence[str]) -> None:
    """ValueError unless there is a ratio and a selector, every ratio in (0, 1], none of
    either twice (a point measured twice would count its prompts twice in its bound)."""
    if not ratios or not selectors:
        raise ValueError("calibration needs at least one ratio and one selector")
    for name, values in (("ratios", ratios), ("selectors", selectors)):
        if len(set(values)) != len(values):
            raise ValueError(f"calibration {name} must differ, got {tuple(values)!r}")
    if not all(is_finite_number(r) and 0 < r <= 1 for r in ratios):
        raise ValueError(f"calibration ratios must be in (0, 1] (0 recomputes nothing), got "
                         f"{tuple(ratios)!r}")


Answered = Result  # one config's answer to one prompt against full prefill's (``saved.py``)


def measure_planned(engine: BlendEngine, runs: Flow, passages: Sequence[str], plan: PromptPlan,
                    per_prompt: int, seed: int, questions: str, instruction: str,
                    on_prompt: Callable[[int, int], None] | None,
                    progress: SavedProgress | None) -> list[list[Answered]]:
    """Per prompt, full prefill's row then each (selector, ratio) the plan still runs: the
    prompts saved by an earlier run first, then new ones while the budget allows."""
    rows = [] if progress is None else progress.load()[:plan.planned]
    for row in rows:
        for r in row[1:]:
            if (r.selector, r.ratio) in plan.tallies:
                plan.record((str(r.selector), float(r.ratio or 0)), r.same_answer, r.answer_kl)
    if progress is not None:
        progress.start(rows)
    made = make_prompts(passages, plan.planned, per_prompt, seed,
                        ask=model_questions(engine) if questions == "model" else None)
    saved = len(rows)
    while len(rows) < plan.fits(len(rows), saved):
        i = len(rows)
        configs = [FULL] + [BlendConfig(selector=s, ratio=r) for s, r in plan.alive()]
        row = answer_one(engine, runs, parts_of(made[i], instruction), configs,
                         plan.target.answer_tokens, i)
        for r in row[1:]:
            plan.record((str(r.selector), float(r.ratio or 0)), r.same_answer, r.answer_kl)
        rows.append(row)
        if progress is not None:
            progress.add(i, row)
        if on_prompt is not None:
            on_prompt(i + 1, plan.planned)
    return rows


def exact_points(plan: PromptPlan, prompts: int) -> list[FrontierPoint]:
    """Ratio 1.0's points, not measured: a full prefill's rows, answers and speed
    (``plan.py``)."""
    if EXACT not in plan.ratios or prompts == 0:
        return []
    return [FrontierPoint(s, EXACT, 1.0, 0.0, 1.0, prompts) for s in plan.selectors]


def measure(engine: BlendEngine, made: Sequence[CalibrationPrompt], target: CalibrationTarget,
            ratios: Sequence[float], selectors: Sequence[str], flow: str = "engine",
            on_prompt: Callable[[int, int], None] | None = None,
            instruction: str = INSTRUCTION) -> tuple[list[FrontierPoint], str]:
    """The frontier of ``selectors`` x ``ratios`` over ``made`` (means over prompts), every
    config measured on every prompt, and the words of the flow that ran."""
    runs = make_flow(flow, engine, profile="profile" in selectors)
    parts = [parts_of(p, instruction) for p in made]
    rows = answer(engine, runs, parts, ratios, selectors, target.answer_tokens, on_prompt)
    return frontier(rows, target.first_sentence), runs.describe()


def answer(engine: BlendEngine, runs: Flow, prompts: Sequence[PromptParts],
           ratios: Sequence[float], selectors: Sequence[str], answer_tokens: int,
           on_prompt: Callable[[int, int], None] | None = None) -> list[list[Answered]]:
    """Per prompt, full prefill's row then each selector's at each ratio (``Answered``), the
    prompt laid out and its chunks stored by ``runs`` (the application's flow); a prompt too
    long for the model loses its last passages."""
    configs = [FULL] + [BlendConfig(selector=s, ratio=r) for s in selectors for r in ratios]
    out = []
    for i, parts in enumerate(prompts):
        out.append(answer_one(engine, runs, parts, configs, answer_tokens, i))
        if on_prompt is not None:
            on_prompt(i + 1, len(prompts))
    return out


def answer_one(engine: BlendEngine, runs: Flow, parts: PromptParts,
               configs: Sequence[BlendConfig], answer_tokens: int,
               index: int) -> list[Answered]:
    """One prompt (the ``index``-th) answered by each of ``configs`` (full prefill's first)."""
    parts, layout = fitted(engine, runs, parts, answer_tokens)
    runs.ingest(index, parts, layout)
    results = compare_answers(engine, layout, configs, answer_tokens)
    first = _first_sentence(results[0].answer.text)
    return [Answered(r.config.selector if r.config.mode == "blend" else None,
                     r.config.ratio if r.config.mode == "blend" else None,
                     r.same_answer, _first_sentence(r.answer.text) == first,
                     r.answer_kl, r.stats.timing.ttft_s) for r in results]


def frontier(rows: Sequence[Sequence[Answered]], first_sentence: bool = False,
             ) -> list[FrontierPoint]:
    """The mean over the prompts that ran it of each (selector, ratio): same answer (whole, or
    the first sentences'), answer KL, and full prefill's mean TTFT on those prompts over its
    mean TTFT (a ratio dropped midway counts the prompts it ran)."""
    runs: dict[tuple[str | None, float | None], list[tuple[Answered, Answered]]] = {}
    for row in rows:
        for a in row[1:]:
            runs.setdefault((a.selector, a.ratio), []).append((row[0], a))
    points = []
    for (selector, ratio), pairs in runs.items():
        same = [a.same_first_sentence if first_sentence else a.same_answer for _, a in pairs]
        full_s = statistics.mean(f.ttft_s for f, _ in pairs)
        points.append(FrontierPoint(str(selector), float(ratio or 0.0),
                                    statistics.mean(map(float, same)),
                                    statistics.mean(a.answer_kl for _, a in pairs),
                                    full_s / statistics.mean(a.ttft_s for _, a in pairs),
                                    len(pairs)))
    return points


def fitted(engine: BlendEngine, runs: Flow, parts: PromptParts, new_tokens: int,
           ) -> tuple[PromptParts, PromptLayout]:
    """``parts`` and its layout, its last passages dropped while the prompt and its answer do
    not fit the model's context (one passage at least: ValueError if even that does not)."""
    while True:
        layout = runs.layout(parts)
        try:
            engine.check_length(layout, new_tokens)
            return parts, layout
        except ValueError:
            if len(parts.chunks) == 1:
                raise ValueError("one passage and its question are longer than the model's "
                                 "context: calibrate on shorter passages") from None
            parts = PromptParts(parts.prefix, parts.chunks[:-1], parts.suffix)


def choose(points: Sequence[FrontierPoint],
           target: CalibrationTarget) -> tuple[str, float | None]:
    """Per selector the smallest ratio that meets ``target`` (its same-answer share judged at
    its lower confidence bound over the point's prompts: ``CalibrationTarget.met``); of those,
    the fastest (then the smaller ratio). (the first selector, None) when no point meets it.
    A ratio of 0 (nothing recomputed: a reuse) is never chosen, whatever it measured."""
    best: FrontierPoint | None = None
    for selector in dict.fromkeys(p.selector for p in points):
        met = [p for p in points if p.selector == selector and p.ratio > 0
               # ratio 1.0 is a full prefill, exact by construction: its shares need no bound
               and target.met(p.same_answer, p.answer_kl, p.prompts if p.ratio < 1 else 0)]
        if not met:
            continue
        smallest = min(met, key=lambda p: p.ratio)
        if best is None or (smallest.speedup, -smallest.ratio) > (best.speedup, -best.ratio):
            best = smallest
    if best is None:
        return points[0].selector, None
    return best.selector, best.ratio


def holdout(engine: BlendEngine, passages: Sequence[str], record: CalibrationRecord,
            target: CalibrationTarget, *, prompts: int = 24, per_prompt: int = 4,
            flow: str = "engine", seed: int = 1,
            instruction: str = INSTRUCTION) -> FrontierPoint | None:
    """The calibrated selector and ratio measured on prompts over other ``passages`` (the other
    half of a corpus): whether the choice generalises. None when no ratio was chosen."""
    if record.ratio is None:
        return None
    made = make_prompts(passages, prompts, per_prompt, seed)
    points, _ = measure(engine, made, target, [record.ratio], [record.selector], flow,
                        instruction=instruction)
    return points[0]


def _first_sentence(text: str) -> str:
    cut = min((i for i in (text.find(". "), text.find("\n")) if i >= 0), default=len(text))
    return normalize_answer(text[:cut])


def model_questions(engine: BlendEngine) -> Callable[[str], str]:
    """A question about a passage, written by the model (greedy, its first line)."""
    from blendrag.config import GenerationConfig

    if engine.tokenizer is None or getattr(engine.tokenizer, "chat_template", None) is None:
        raise ValueError("questions written by the model need a chat model (a tokenizer with a "
                         "chat template); use the generic questions")

    def ask(passage: str) -> str:
        layout = engine.build_prompt("Write one short question that the passage below "
                                     "answers.\n\n", [passage], "\n\nQuestion:")
        out = engine.generate(layout, FULL, GenerationConfig(max_new_tokens=32, stop=("\n",)))
        question = out.text.strip()
        return question if question else "What is this passage about?"

    return ask
