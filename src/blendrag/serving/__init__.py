"""Many requests on one model at once: a scheduler with continuous batching
(``scheduler.py``), its limits (``config.py``), the KV pool's accounting (``pool.py``), the
caller's handle of a request (``handle.py``) and what a served request can fail with
(``errors.py``)."""

from blendrag.serving.config import ServingConfig
from blendrag.serving.errors import PromptTooLarge, QueueFull, RequestCancelled, RequestTimeout
from blendrag.serving.handle import ServedRequest
from blendrag.serving.scheduler import Scheduler, SchedulerStats, scheduler_for

__all__ = ["PromptTooLarge", "QueueFull", "RequestCancelled", "RequestTimeout", "Scheduler",
           "SchedulerStats", "ServedRequest", "ServingConfig", "scheduler_for"]
