"""What a calibration still has to measure, and what its time budget allows.

A calibration answers every prompt with full prefill and with blend at each ratio: on the
default model on 2 cores, 24 prompts x 6 ratios took 12.5 minutes. Most of that time can be
known to be wasted before it is spent:

- *ratio 1.0* recomputes every token: its rows are a full prefill's (exact by construction,
  and the default config then runs the full prefill itself), so it is never measured: its
  point is full prefill's (same answer 1, answer KL 0, speed-up 1);
- a ratio that can no longer meet the target on the planned prompts, even if every prompt
  still to come kept full's answer and added no answer KL, is *dropped*: later prompts do not
  run it (its point then holds the prompts it ran, and cannot be chosen);
- a *time budget*: once a prompt has been measured, the prompts left are counted against the
  time left at the pace measured so far, and the plan shrinks to what fits (``fits``).

``min_prompts`` is the smallest number of prompts whose all-same share reaches the same-answer
target at its lower confidence bound: with fewer, no ratio below 1.0 can be chosen, which the
command says before it starts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from blendrag.calibration.target import CalibrationTarget, lower_bound

EXACT = 1.0  # the ratio whose rows are a full prefill's


def min_prompts(target: CalibrationTarget, most: int = 10_000) -> int:
    """The fewest prompts on which a share of 1.0 meets ``target.same_answer`` at its lower
    bound (1 when the target asks no share); ``most`` + 1 when none up to ``most`` does."""
    if target.same_answer is None:
        return 1
    for n in range(1, most + 1):
        if lower_bound(1.0, n) >= target.same_answer:
            return n
    return most + 1


def fitting(planned: int, done: int, started: float, budget_s: float | None) -> int:
    """How many of ``planned`` items (prompts, questions) a budget of ``budget_s`` seconds from
    ``started`` (``time.perf_counter``) allows, ``done`` measured so far at their pace: never
    fewer than ``done``, never more than ``planned`` (all of them without a budget, or before
    any pace is known)."""
    if budget_s is None or done == 0:
        return planned
    spent = time.perf_counter() - started
    pace = spent / done
    more = max(0, math.floor((budget_s - spent) / pace)) if pace > 0 else planned
    return min(planned, done + more)


@dataclass
class Tally:
    """What one (selector, ratio) measured so far."""

    prompts: int = 0
    misses: int = 0  # answers that were not full prefill's
    answer_kl: float = 0.0  # summed over prompts


@dataclass
class PromptPlan:
    """Which ratios each next prompt runs, and how many prompts there will be.

    ``planned``: prompts asked for (shrunk by ``fits`` to what the budget allows);
    ``budget_s``: seconds the measuring may take from ``started`` (None: no limit)."""

    target: CalibrationTarget
    planned: int
    ratios: Sequence[float]
    selectors: Sequence[str]
    budget_s: float | None = None
    started: float = field(default_factory=lambda: time.perf_counter())
    tallies: dict[tuple[str, float], Tally] = field(default_factory=dict)
    dropped: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget_s is not None and not (math.isfinite(self.budget_s)
                                              and self.budget_s > 0):
            raise ValueError(f"a calibration's time budget must be > 0 seconds, got "
                             f"{self.budget_s!r}")
        for key in self.measured():
            self.tallies.setdefault(key, Tally())

    def measured(self) -> list[tuple[str, float]]:
        """Every (selector, ratio) that prompts run (ratio 1.0 never: module docstring)."""
        return [(s, r) for s in self.selectors for r in self.ratios if r < EXACT]

    def alive(self) -> list[tuple[str, float]]:
        """The (selector, ratio) pairs the next prompt runs: those not dropped."""
        return [k for k in self.measured() if k not in self.dropped]

    def record(self, key: tuple[str, float], same: bool, answer_kl: float) -> None:
        """One prompt's result for ``key``; the pair is dropped once it cannot meet the
        target on ``planned`` prompts."""
        t = self.tallies[key]
        t.prompts, t.misses, t.answer_kl = t.prompts + 1, t.misses + (not same), \
            t.answer_kl + answer_kl
        if key not in self.dropped and not self._reachable(t):
            self.dropped.append(key)

    def _reachable(self, t: Tally) -> bool:
        n = max(self.planned, t.prompts)
        best_share = (n - t.misses) / n  # every prompt still to come the same
        best_kl = t.answer_kl / n  # ... and adding no answer KL
        return self.target.met(best_share, best_kl, n)

    def fits(self, done: int, saved: int = 0) -> int:
        """The prompts the budget allows, ``done`` measured so far, of them ``saved`` taken
        from an earlier run (no time now: the pace is this run's prompts'; never fewer than
        ``done``, never more than ``planned``); ``planned`` shrinks to it."""
        self.planned = saved + fitting(self.planned - saved, done - saved, self.started,
                                       self.budget_s)
        return self.planned

    def words(self) -> str:
        """The plan in words, for the command's report."""
        minimum = min_prompts(self.target)
        line = (f"{self.planned} prompts x {len(self.measured())} ratios measured (ratio 1.0 "
                f"is a full prefill's rows: not measured)")
        if self.target.same_answer is not None:
            line += (f"; the same-answer target {self.target.same_answer:g} needs at least "
                     f"{minimum} prompts at its 90 % bound")
            if self.planned < minimum:
                line += f": with {self.planned} only ratio 1.0 (the full prefill) can be chosen"
        return line
