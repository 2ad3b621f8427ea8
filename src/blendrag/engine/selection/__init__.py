"""Selection: which cached rows a blend trusts and which tokens it recomputes, at what ratio.

``selectors.py`` holds every selector (one registry; ``preview.py``: the suffix's attention over
the cached rows, the default's signal); ``ape.py`` rescales attention to reused rows; the
loading controller (``controller.py``) chooses ``ratio="auto"`` from measured load and compute
times and, with ``costs.py``'s device profile, whether a mode would beat a full prefill;
``calibrated.py`` is the calibrated default config the store keeps for a model.
"""
