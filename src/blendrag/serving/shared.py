"""One scheduler per model: shared by an engine's namespace views and by every framework LLM
over them, so that all their requests share its batched steps."""

from __future__ import annotations

import threading
import weakref

from blendrag.engine import BlendEngine
from blendrag.engine.compute.runner import ModelRunner
from blendrag.serving.config import ServingConfig
from blendrag.serving.scheduler import Scheduler

_SCHEDULERS: weakref.WeakKeyDictionary[ModelRunner, Scheduler] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def scheduler_for(engine: BlendEngine, config: ServingConfig | None = None) -> Scheduler:
    """The scheduler of ``engine``'s model, shared by all its namespace views and every framework
    LLM over them (made at the first call; ``config`` applies then: a later different config is
    a ValueError, since one model has one scheduler)."""
    with _LOCK:
        scheduler = _SCHEDULERS.get(engine.runner)
        if scheduler is None or scheduler.closed:  # a closed one is replaced
            scheduler = _SCHEDULERS[engine.runner] = Scheduler(engine.runner, config)
        elif config is not None and config != scheduler.config:
            raise ValueError(f"this engine's model is served with {scheduler.config} already; "
                             "close that scheduler first")
        return scheduler
