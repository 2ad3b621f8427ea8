"""Serve blendrag on Ray Serve (``pip install "blendrag[serve]"``): N replicas of one engine
behind one HTTP route, sharing one Redis or S3 KV tier.

Each replica builds its engine from an ``EngineSpec`` (the model loaded in the replica, the
shared tier opened there) and serves its requests through the engine's scheduler
(blendrag.serving: batched decoding, a bounded queue, timeouts), awaited on the replica's event
loop. A chunk ingested through any replica is written to the shared tier, so every other
replica serves it as a hit (and keeps it in its own RAM tier from then on). Ray Serve routes,
scales and restarts the replicas; nothing here schedules anything.

HTTP (a small completions API in OpenAI's shape, plus ingestion):

- ``POST /v1/completions`` ``{"prompt": str, "documents": [str, ...], "max_tokens": int,
  "temperature": float, "mode": str, "ratio": float, "namespace": str}``: the prompt spells
  each document in it as the chunk format writes it (``ChunkFormat``, as LangChain's
  ``documents=``); the answer is ``{"choices": [{"text", "finish_reason"}], "usage": {...},
  "blendrag": stats, "replica"}`` (a full queue: 503; past its timeout: 504; a bad body: 400
  that says what is wrong);
- ``POST /v1/ingest`` ``{"texts": [str, ...], "namespace": str}``: precompute and store their
  KVs;
- ``GET /health``.

Every key is optional but ``prompt`` and ``texts``; a key the route does not know (a misspelt
``max_token``) is a 400 naming it, never ignored. ``namespace``: the tenant (or tenant/user)
whose own KVs and text index the request reads and writes (``BlendClient.serving``; absent or
null: the engine's own); whoever can reach the route chooses it, so put the tenant's
authentication in front of the route and set it there, never from a user's text.

Start it (docs/serving.md)::

    serve run blendrag.distributed.ray_serve:build_app model=smollm2-135m-instruct \\
        redis_url=redis://10.0.0.5:6379/0 replicas=2
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.integration.client import BlendClient
from blendrag.integration.fallback import FallbackFixes
from blendrag.serving import QueueFull, ServingConfig, scheduler_for
from blendrag.spec import EngineSpec
from blendrag.store.config import StoreConfig

COMPLETION_KEYS = ("prompt", "documents", "max_tokens", "temperature", "mode", "ratio",
                   "namespace")
INGEST_KEYS = ("texts", "namespace")

FIXES = FallbackFixes(
    empty_index="send the request's retrieved passages as \"documents\"",
    not_in_prompt="send the request's retrieved passages as \"documents\"",
    documents_not_in_prompt="write each document into the prompt as the chunk format spells it",
    not_ingested="POST the passages to /v1/ingest first (any replica: the KVs are shared)",
)


@dataclass(frozen=True)
class ServeSettings:
    """A Ray Serve application of one engine.

    spec: how each replica builds its engine; its store must have a shared tier (Redis or S3):
      replicas share nothing else. replicas: how many (Ray Serve's ``num_replicas``).
    serving: each replica's scheduler limits (None: the defaults).
    cpus_per_replica, gpus_per_replica: what each replica asks Ray for.
    """

    spec: EngineSpec
    replicas: int = 2
    serving: ServingConfig | None = None
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0

    def __post_init__(self) -> None:
        store = self.spec.store
        if store is None or not (store.redis_url or store.s3_url):
            raise ValueError("replicas share chunk KVs only through a shared tier: give the "
                             "spec a StoreConfig with redis_url or s3_url")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.cpus_per_replica < 0 or self.gpus_per_replica < 0:
            raise ValueError("cpus_per_replica and gpus_per_replica must be >= 0")


class BlendServer:
    """One replica: its engine, the client that finds documents in prompts, its scheduler."""

    def __init__(self, settings: ServeSettings) -> None:
        engine = settings.spec.build()
        scheduler_for(engine, settings.serving)
        self.client = BlendClient(engine, fixes=FIXES, name="BlendServer")

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One completion (the body of ``POST /v1/completions``)."""
        _check_keys(body, COMPLETION_KEYS, "/v1/completions")
        client = self._serving(body.get("namespace"))
        prompt, documents = body.get("prompt"), body.get("documents")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("\"prompt\" must be a non-empty string")
        if documents is not None and not (isinstance(documents, list)
                                          and all(isinstance(d, str) for d in documents)):
            raise ValueError("\"documents\" must be a list of strings")
        blend = BlendConfig(**{k: body[k] for k in ("mode", "ratio") if k in body})
        generation = GenerationConfig(max_new_tokens=int(body.get("max_tokens", 64)),
                                      temperature=float(body.get("temperature", 0.0)))
        request = client.start(prompt, blend, generation, texts=documents, served=True)
        result = await request.served.wait_async()
        info = client.finish(request)
        stats = result.stats
        return {"object": "text_completion", "model": self.client.engine.name,
                "choices": [{"index": 0, "text": result.text,
                             "finish_reason": result.finish_reason}],
                "usage": {"prompt_tokens": stats.prompt.tokens,
                          "completion_tokens": stats.decode.new_tokens,
                          "total_tokens": stats.prompt.tokens + stats.decode.new_tokens},
                "blendrag": info["blendrag"], "replica": _replica()}

    def ingest(self, texts: list[str], namespace: str | None = None) -> dict[str, Any]:
        """Precompute and store the KVs of ``texts`` in ``namespace`` (None: the engine's; the
        body of ``POST /v1/ingest``)."""
        client = self._serving(namespace)
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("\"texts\" must be a list of strings")
        return {**client.ingest(texts, progress=False).to_dict(), "replica": _replica()}

    def _serving(self, namespace: object) -> BlendClient:
        """The client serving ``namespace`` (None: the engine's own); ValueError for a value
        that is no namespace."""
        if namespace is not None and not isinstance(namespace, str):
            raise ValueError("\"namespace\" must be a string (a tenant, or tenant/user) or null, "
                             f"got {type(namespace).__name__}")
        return self.client.serving(namespace)

    async def __call__(self, request: Any) -> Any:
        """The HTTP route (a Starlette request, as Ray Serve hands it)."""
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        try:
            if request.method == "GET" and path.endswith("/health"):
                return JSONResponse({"status": "ok", "replica": _replica()})
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if request.method == "POST" and path.endswith("/v1/completions"):
                return JSONResponse(_finite(await self.complete(body)))
            if request.method == "POST" and path.endswith("/v1/ingest"):
                _check_keys(body, INGEST_KEYS, "/v1/ingest")
                return JSONResponse(_finite(self.ingest(body.get("texts"),  # type: ignore[arg-type]
                                                        body.get("namespace"))))
            return JSONResponse({"error": f"no route {request.method} {path}"}, status_code=404)
        except QueueFull as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        except TimeoutError as exc:  # the request's timeout (ServingConfig.timeout_s)
            return JSONResponse({"error": str(exc)}, status_code=504)
        # a bad body: a value no setting takes (1e400 as max_tokens: OverflowError), nesting
        # past what the parser recurses into
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"[:500]}, status_code=400)


def _check_keys(body: dict[str, Any], known: tuple[str, ...], route: str) -> None:
    """ValueError naming the keys of ``body`` that ``route`` does not take, and those it does."""
    unknown = sorted(str(k) for k in body if k not in known)
    if unknown:
        raise ValueError(f"POST {route} takes no key {', '.join(map(repr, unknown))} (a "
                         f"misspelling?); its keys: {', '.join(known)}")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (JSON's null): the stats say "not
    predicted" with NaN (a request that ran full because chunks were missing), which strict
    JSON cannot carry (the reply would fail as a 400)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _replica() -> str:
    """This replica's id in Ray Serve ("local" outside one)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # not in a replica (a direct call in a test)
        return "local"


def app(settings: ServeSettings) -> Any:
    """The Ray Serve application: ``serve.run(app(settings))``."""
    try:
        from ray import serve
    except ImportError as exc:
        raise ImportError("serving on Ray needs Ray Serve: pip install \"blendrag[serve]\"") \
            from exc
    deployment: Any = serve.deployment(
        BlendServer, name="blendrag", num_replicas=settings.replicas,
        ray_actor_options={"num_cpus": settings.cpus_per_replica,
                           "num_gpus": settings.gpus_per_replica})
    return deployment.bind(settings)


def build_app(args: dict[str, str]) -> Any:
    """The application ``serve run blendrag.distributed.ray_serve:build_app key=value ...``
    builds: ``model``, ``redis_url`` or ``s3_url`` (with ``s3_endpoint_url``), ``replicas``,
    ``device``, ``dtype``, ``max_seqs``, ``gpus_per_replica``."""
    known = {"model", "redis_url", "s3_url", "s3_endpoint_url", "replicas", "device", "dtype",
             "max_seqs", "gpus_per_replica"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown arguments {sorted(unknown)}; known: {sorted(known)}")
    store = StoreConfig(disk_dir=None, redis_url=args.get("redis_url"),
                        s3_url=args.get("s3_url"), s3_endpoint_url=args.get("s3_endpoint_url"))
    spec = EngineSpec(model=args.get("model", EngineSpec.model), device=args.get("device"),
                      dtype=args.get("dtype", "float32"), store=store, chunk_prefix="")
    serving = ServingConfig(max_seqs=int(args["max_seqs"])) if "max_seqs" in args else None
    return app(ServeSettings(spec, replicas=int(args.get("replicas", 2)), serving=serving,
                             gpus_per_replica=float(args.get("gpus_per_replica", 0))))
