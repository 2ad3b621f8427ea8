"""Selection: which cached rows a blend trusts and which tokens it recomputes, at what ratio.

``selectors.py`` holds the selectors' base, their one registry and the static selectors
(``preview.py``: the suffix's attention over the cached rows, the default's signal), and
``scoring.py`` CacheBlend's and the query's, which filter at check layers; ``ape.py`` rescales
attention to reused rows; the loading controller (``controller.py``) chooses ``ratio="auto"``
from measured load and compute times and, with ``costs.py``'s device profile, whether a mode
would beat a full prefill; ``calibrated.py`` is the calibrated default config the store keeps
for a model.
"""

from blendrag.config import SELECTORS
from blendrag.engine.selection import scoring  # noqa: F401 - registers the scoring selectors
from blendrag.engine.selection.selectors import REGISTRY

_MISSING = set(SELECTORS.values()) - set(REGISTRY)
if _MISSING:  # a selector named in blendrag.config without an implementation: fail at import
    raise ImportError(f"no selector implements {sorted(t.__name__ for t in _MISSING)}")
