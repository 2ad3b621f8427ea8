"""Layer-wise reads of one S3 object: ranged GETs, issued ahead of the layer loop.

An object store answers each GET after a round trip of milliseconds, so one GET per layer per
chunk, in turn, would make loading latency-bound (docs/benchmarks.md, "From S3").
When the codec has parsed an entry's header it announces the byte spans of every layer
(``read_ahead``); the spans are fetched by a small pool of threads shared by the tier, lowest
layer first across all entries open at once, since the engine needs layer 0 of every chunk
before layer 1 of any. A read then waits for the spans that cover it.

A span is fetched with ``If-Match`` on the ETag seen when the object was opened: an object
replaced meanwhile answers 412, reported as a damaged read of this entry (``EntryError``),
which the store judges with a fresh read before deleting anything.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from typing import Any

from blendrag.store.errors import EntryError
from blendrag.store.readers import RangeReader, scatter


class ShortBody(Exception):
    """Fewer bytes came back than the range asked for while the object is as large as opened
    (a cut connection): a failed read, not a damaged entry."""


class FetchPool:
    """Threads that run ranged GETs in priority order (layer index, then arrival); also the
    disk tier's layer reads ahead (``layered.py``)."""

    def __init__(self, workers: int, name: str = "s3-get") -> None:
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"{name}-{i}")
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, priority: int, fn) -> Future:
        future: Future = Future()
        self._jobs.put((priority, next(self._order), fn, future))
        return future

    def _work(self) -> None:
        while True:
            _, _, fn, future = self._jobs.get()
            if fn is None:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the reader that waits for it
                    future.set_exception(exc)

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put((-1, next(self._order), None, None))

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads to end after ``close`` (each up to ``timeout`` seconds)."""
        for t in self._threads:
            t.join(timeout)


class S3Ranges(RangeReader):
    """One S3 object read by byte ranges. Opening costs one GET: the first ``HEAD`` bytes (the
    entry's header) and, from Content-Range, the object's size. It ``fetches_ahead``: the
    codec announces every layer's spans once the header is parsed (``read_ahead``)."""

    fetches_ahead = True
    HEAD = 64 << 10
    GROUP = 4 << 20  # the most bytes one read-ahead GET fetches

    def __init__(self, client: Any, bucket: str, name: str, size: int, etag: str, head: bytes,
                 pool: FetchPool | None) -> None:
        self._client, self._bucket, self._name = client, bucket, name
        self.size, self._etag, self._head, self._pool = size, etag, head, pool
        # span start -> (span end, the GET that fetches it, where that GET starts)
        self._ahead: dict[int, tuple[int, Future, int]] = {}

    @classmethod
    def open(cls, client: Any, bucket: str, name: str,
             pool: FetchPool | None) -> S3Ranges | None:
        errors = client.exceptions
        try:
            reply = client.get_object(Bucket=bucket, Key=name, Range=f"bytes=0-{cls.HEAD - 1}")
        except errors.NoSuchKey:
            return None
        except errors.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidRange":
                raise
            return cls(client, bucket, name, 0, "", b"", pool)  # an empty object: truncated
        size = _total_size(reply)
        head = reply["Body"].read()
        if len(head) != min(size, cls.HEAD):
            raise ShortBody(f"GET {name} returned {len(head)} of its first "
                            f"{min(size, cls.HEAD)} bytes")
        return cls(client, bucket, name, size, reply["ETag"], head, pool)

    def read_ahead(self, spans: list[list[tuple[int, int]]]) -> None:
        """Start fetching ``spans[i]`` (absolute [start, end) byte ranges of layer ``i``) in
        the background. Spans adjacent in the object are fetched together, up to ``GROUP``
        bytes a GET: an entry's tensors are stored by name (k.0, k.1, k.10, ...), so one GET
        serves several layers, and a GET's round trip, not its bytes, is what costs."""
        if self._pool is None:
            return
        flat = sorted((start, end, layer) for layer, layer_spans in enumerate(spans)
                      for start, end in layer_spans if end > len(self._head))
        group: list[tuple[int, int, int]] = []
        for item in flat:
            if group and (item[0] != group[-1][1] or item[1] - group[0][0] > self.GROUP):
                self._fetch_group(group)
                group = []
            group.append(item)
        if group:
            self._fetch_group(group)

    def _fetch_group(self, group: list[tuple[int, int, int]]) -> None:
        start, end = group[0][0], group[-1][1]
        future = self._pool.submit(min(layer for _, _, layer in group),  # type: ignore[union-attr]
                                   lambda: self._get(start, end))
        for s, e, _ in group:
            self._ahead[s] = (e, future, start)

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= len(self._head):
            return self._head[offset:end]
        if end <= offset:
            return b""
        parts, at = [], offset
        while at < end and at in self._ahead:  # spans fetched ahead that tile the range
            span_end, future, base = self._ahead.pop(at)
            parts.append(future.result()[at - base:span_end - base])
            at = span_end
        if at < end:
            parts.append(self._get(at, end))
        data = b"".join(parts)
        return data[: end - offset]

    def read_into_many(self, offset: int, bufs: list[memoryview]) -> int:
        return scatter(self.read(offset, sum(len(b) for b in bufs)), bufs)

    def _get(self, start: int, end: int) -> bytes:
        try:
            reply = self._client.get_object(Bucket=self._bucket, Key=self._name, IfMatch=self._etag,
                                            Range=f"bytes={start}-{end - 1}")
        except self._client.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "NoSuchKey"):
                raise EntryError(f"{self._name} was replaced or deleted while being read") from None
            raise
        data = reply["Body"].read()
        if len(data) != end - start:
            raise ShortBody(f"GET {self._name} bytes {start}-{end - 1} returned {len(data)} "
                            f"of {end - start}")
        return data

    def close(self) -> None:
        for _, future, _ in self._ahead.values():
            future.cancel()
        self._ahead.clear()
        self._head = b""


def _total_size(reply: dict) -> int:
    """The object's size from a ranged GET's Content-Range (``bytes a-b/size``)."""
    content_range = reply.get("ContentRange")
    if content_range:
        return int(content_range.rsplit("/", 1)[1])
    return int(reply["ContentLength"])  # the server sent the whole (small) object
