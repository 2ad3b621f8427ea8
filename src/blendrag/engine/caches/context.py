"""The ingestion context: what a chunk's stored KV is computed after.

A chunk computed right after the prompt prefix "believes" it is the first passage of the
prompt; in a real prompt it mostly follows other passages, and its deep-layer keys and values
differ accordingly (reusing such KVs moves the answer far more than KVs computed after other
passages: docs/architecture.md, "The default ingestion context", has the figures). Computed
after *any* passage, the stored rows are much closer to what the prompt needs. blendrag
therefore computes each chunk after each of a few fixed filler contexts (by default three, of
two unrelated encyclopedic passages each),
averages the K and V rows over them (the mean is the least-squares guess when the real
predecessors are unknown), and records per layer how far the context moved each token's values
(``ChunkKV.context_shift``, the ``preview`` selector's prior). The prefix + filler rows are
cached like any prefix, so ingestion costs one chunk forward per filler, plus one alone.

The one passage whose predecessors *are* known is the prompt's first: it follows the prefix
alone. With ``exact_first`` (the default) the chunk computed alone is stored too, under the
no-context key, and a request whose prefix is the chunk prefix takes its first passage's rows
from there: exact rows, nothing to recompute (twice the stored bytes per chunk).
Figures for both choices: docs/architecture.md, "The default ingestion context".

The fillers are plain English prose; for a corpus of another language or of code, pass
typical passages of it (``BlendEngine(context=ChunkContext(fillers=(a, b)))``).
``ChunkContext(fillers=())`` stores chunks computed right after the prefix only (exact for a
chunk that directly follows that prefix; what prefix caching uses).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from blendrag.kv.chunk_kv import ChunkKV

if TYPE_CHECKING:
    from blendrag.engine.compute.runner import ModelRunner

PASSAGES: tuple[str, ...] = (
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
    "The painter was born in a small coastal town and trained in the workshop of a local "
    "craftsman before moving to the capital. Her early works were portraits of fishermen and "
    "their families, painted in dark colours on wooden panels. Later she travelled widely, and "
    "the light of the southern cities changed her style: her landscapes became brighter and "
    "her brushwork freer. She exhibited in several countries, taught at the academy for many "
    "years and left more than four hundred paintings, most of which are now held in public "
    "collections.\n\n",
    "The bridge was designed to carry a road and a railway across the estuary, where strong "
    "tides and soft ground had defeated earlier plans. Construction took seven years and "
    "employed more than two thousand workers. The main span is supported by two steel towers "
    "resting on deep concrete foundations, and the deck was assembled in sections that were "
    "floated into place on barges. When it opened, it shortened the journey between the two "
    "ports by several hours, and it remains one of the longest structures of its kind in the "
    "country.\n\n",
    "The festival takes place every summer in the old quarter of the city and lasts for two "
    "weeks. It began as a small gathering of folk musicians and has grown into one of the "
    "largest cultural events in the region, with concerts, theatre, dance and street markets. "
    "Performers come from many countries, and most of the events are free. The organisers are "
    "a non-profit association supported by the city council and by local businesses, and the "
    "festival attracts tens of thousands of visitors each year.\n\n",
    "The species lives in dry forests and open grasslands, where it feeds mainly on seeds and "
    "insects. Adults are about twenty centimetres long, with brown upper parts and a pale "
    "breast marked with dark streaks. They nest on the ground, laying two or three eggs in a "
    "shallow hollow lined with grass. The population has declined in recent decades because "
    "of the loss of its habitat to farming, and the bird is now protected in several of the "
    "countries where it breeds.\n\n",
)
"""Six plain encyclopedic passages on unrelated topics: the default fillers' material."""

# Three contexts of two passages each: a chunk in a prompt mostly follows more than one
# passage, and the mean over more contexts is a better guess of rows whose real predecessors
# are unknown (docs/architecture.md, "The default ingestion context").
DEFAULT_FILLERS: tuple[str, ...] = tuple(PASSAGES[i] + PASSAGES[i + 1] for i in (0, 2, 4))


@dataclass(frozen=True)
class ChunkContext:
    """What stored chunk KVs are computed after: the chunk prefix, then each of ``fillers`` in
    turn (rows averaged over the fillers); no fillers: the chunk prefix alone.

    ``exact_first``: also store each chunk computed after the chunk prefix alone, and use those
    exact rows for a prompt's first passage (when the prompt's prefix is the chunk prefix).
    Only meaningful with fillers; not part of the store key (the in-context entry is the same
    either way)."""

    fillers: tuple[str, ...] = DEFAULT_FILLERS
    exact_first: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.fillers, str) or not all(isinstance(f, str) and f.strip()
                                                    for f in self.fillers):
            raise ValueError("fillers must be a sequence of non-empty strings (or empty for none)")
        if not isinstance(self.exact_first, bool):
            raise ValueError(f"exact_first must be a bool, got {self.exact_first!r}")
        object.__setattr__(self, "fillers", tuple(self.fillers))

    @property
    def stores_alone(self) -> bool:
        """Whether ingestion stores the chunk computed alone beside its in-context rows."""
        return bool(self.fillers) and self.exact_first

    @functools.cached_property
    def tag(self) -> str:
        """Part of every store key: "" for no fillers, else a digest of the filler texts
        (computed once: every request's lookups read it)."""
        if not self.fillers:
            return ""
        digest = hashlib.sha256(json.dumps(self.fillers).encode()).hexdigest()[:16]
        return f"fill{len(self.fillers)}-{digest}"


NO_CONTEXT = ChunkContext(fillers=())


def in_context(runner: ModelRunner, alone: ChunkKV, chunk_prefix_ids: Sequence[int],
               fillers: Sequence[tuple[Sequence[int], ChunkKV]], tag: str) -> ChunkKV:
    """The chunk of ``alone`` (computed after the chunk prefix) computed after the chunk prefix
    + each filler instead (``fillers``: each filler's ids and the KV of chunk prefix + filler),
    K and V averaged over the fillers, with its context shift: per layer, the squared distance
    of each token's averaged values from ``alone``'s, summed over heads. -> ChunkKV
    [L, Hkv, T, D] tagged ``tag``."""
    ids = list(alone.token_ids)
    keys, values = torch.zeros_like(alone.keys), torch.zeros_like(alone.values)
    for filler_ids, filler_kv in fillers:
        kv = runner.compute_chunk(filler_kv, [*chunk_prefix_ids, *filler_ids], ids)
        keys += kv.keys
        values += kv.values
    keys /= len(fillers)
    values /= len(fillers)
    shift = (values.float() - alone.values.float()).pow(2).sum(dim=(1, 3)).cpu()  # [L, T]
    return ChunkKV(keys, values, alone.token_ids, alone.prefix_hash, alone.profile, tag, shift)
