"""What a served request can fail with besides the engine's own errors: each names the limit and
the numbers, and reaches only the request it is about."""

from __future__ import annotations


class QueueFull(RuntimeError):
    """The scheduler's queue holds ``ServingConfig.max_queue`` requests: retry later (an HTTP
    server answers 503)."""


class RequestTimeout(TimeoutError):
    """The request was not done within its timeout; its slot and pool blocks are freed."""


class RequestCancelled(RuntimeError):
    """The request was cancelled (its caller went away); its slot and pool blocks are freed."""


class PromptTooLarge(ValueError):
    """The request's prompt and answer can never fit the KV pool: refused before it takes a
    slot."""
