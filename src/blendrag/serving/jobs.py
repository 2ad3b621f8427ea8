"""A request inside the scheduler (``Job``) and what the scheduler has done (``SchedulerStats``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationStream
from blendrag.engine.request.prefill import Prefill
from blendrag.prompt import PromptLayout
from blendrag.serving.handle import ServedRequest


@dataclass
class Job:
    """One request from its submission to its last token: what was asked, its handle, when it
    must be done by, and once prefilled its token stream and the pool blocks it holds."""

    engine: BlendEngine
    layout: PromptLayout
    blend: BlendConfig
    generation: GenerationConfig
    handle: ServedRequest
    started: float  # when it arrived (perf_counter): its TTFT counts from there
    timeout_s: float | None
    deadline: float | None
    prepare: Callable[[Prefill], None] | None
    stream: GenerationStream | None = None
    blocks: int = 0  # pool blocks held from admission to the end
    slot: int | None = None  # the slab slot its KV lives in, from admission to the end

    def gone(self, now: float) -> bool:
        """Cancelled, or past its deadline."""
        return self.handle.cancelled or (self.deadline is not None and now > self.deadline)


@dataclass
class SchedulerStats:
    """What the scheduler has done since it was made."""

    requests: int = 0
    steps: int = 0  # batched decoding steps
    decoded: int = 0  # tokens decoded in them
    refused: int = 0  # requests refused at submit (queue full, too large)
    timed_out: int = 0
    cancelled: int = 0
    packed: int = 0  # prefills whose main pass ran packed with other requests'

    @property
    def mean_batch(self) -> float:
        """Requests per decoding step, on average."""
        return self.decoded / self.steps if self.steps else 0.0
