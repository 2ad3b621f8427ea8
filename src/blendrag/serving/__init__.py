"""Many requests on one model at once: a scheduler with continuous batching
(``scheduler.py``; one per model, ``shared.py``), its limits (``config.py``), a request inside
it (``jobs.py``), the KV pool's accounting (``pool.py``), the caller's handle of a request
(``handle.py``) and what a served request can fail with (``errors.py``)."""

from blendrag.serving.config import ServingConfig
from blendrag.serving.errors import PromptTooLarge, QueueFull, RequestCancelled, RequestTimeout
from blendrag.serving.handle import ServedRequest
from blendrag.serving.jobs import SchedulerStats
from blendrag.serving.scheduler import Scheduler
from blendrag.serving.shared import scheduler_for

__all__ = ["PromptTooLarge", "QueueFull", "RequestCancelled", "RequestTimeout", "Scheduler",
           "SchedulerStats", "ServedRequest", "ServingConfig", "scheduler_for"]
