"""The ingestion context: what a chunk's stored KV is computed after.

A chunk computed right after the prompt prefix "believes" it is the first passage of the
prompt; in a real prompt it mostly follows other passages, and its deep-layer keys and values
differ accordingly (measured on SmolLM2-135M-Instruct: reuse of such KVs moves the first-token
distribution by KL 0.50 on the synthetic set). Computed after *any* passage, the stored rows
are much closer to what the prompt needs (KL 0.14-0.16 after a random or a fixed passage;
docs/architecture.md, "Ingestion context"). blendrag therefore computes each chunk
after each of a few fixed filler passages, averages the K and V rows over them (the mean is
the least-squares guess when the real predecessors are unknown), and records per layer how far
the context moved each token's values (``ChunkKV.context_shift``, the ``preview`` selector's
prior). The prefix + filler rows are cached like any prefix, so ingestion costs one chunk
forward per filler.

The fillers are plain English encyclopedic prose; for a corpus of another language or of code,
pass two typical passages of it (``BlendEngine(context=ChunkContext(fillers=(a, b)))``).
``ChunkContext(fillers=())`` stores chunks computed right after the prefix (exact for a chunk
that directly follows that prefix; what prefix caching uses).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

DEFAULT_FILLERS: tuple[str, ...] = (
    "The river rises in a range of low hills and flows north for about three hundred kilometres "
    "before it reaches the sea. Its valley has been farmed since ancient times, and several "
    "market towns grew up at the old crossing points, where bridges replaced the fords in the "
    "Middle Ages. "
    "The climate is mild, with most of the rain falling in autumn and winter. In the nineteenth "
    "century a canal was dug beside the lower course, and a railway followed a few decades later, "
    "which brought new industries to the area. Today the valley is known for its orchards, its "
    "vineyards and a number of small museums that describe the history of the region and the lives "
    "of the people who worked on the river.\n\n",
    "The society was founded by a group of teachers and engineers who met every month to discuss "
    "new ideas in science and education. Its first president was elected in the year of its "
    "foundation and served for more than a decade. The members published a yearly journal, "
    "organised public lectures and built up a library of several thousand books, many of which "
    "were donated by their authors. Over time the society opened branches in other cities, awarded "
    "prizes for research and supported young students with small grants. Its archive, which "
    "includes letters, photographs and the minutes of every meeting, is now kept in the city "
    "library and is open to researchers.\n\n",
)


@dataclass(frozen=True)
class ChunkContext:
    """What stored chunk KVs are computed after: the chunk prefix, then each of ``fillers`` in
    turn (rows averaged over the fillers); no fillers: the chunk prefix alone."""

    fillers: tuple[str, ...] = DEFAULT_FILLERS

    def __post_init__(self) -> None:
        if isinstance(self.fillers, str) or not all(isinstance(f, str) and f.strip()
                                                    for f in self.fillers):
            raise ValueError("fillers must be a sequence of non-empty strings (or empty for none)")
        object.__setattr__(self, "fillers", tuple(self.fillers))

    @property
    def tag(self) -> str:
        """Part of every store key: "" for no fillers, else a digest of the filler texts."""
        if not self.fillers:
            return ""
        digest = hashlib.sha256(json.dumps(self.fillers).encode()).hexdigest()[:16]
        return f"fill{len(self.fillers)}-{digest}"


NO_CONTEXT = ChunkContext(fillers=())
