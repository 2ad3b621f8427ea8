"""Calibration: the smallest recompute ratio whose whole answers stay full prefill's on the
user's own model and passages (``calibrate``), kept beside the store per model and corpus and
used by the default ``BlendConfig()`` (``CalibrationBook``); or, on labelled questions, the
smallest ratio whose answer quality stays within a margin of full prefill's
(``calibrate_qa``, ``qa_run.py``).

Light on import (the command line reads ``FLOWS``): the parts load torch when used.
"""

FLOWS = ("integration", "engine")
"""How prompts are laid out and chunk KVs stored: the framework LLMs' way, or the engine's
(``blendrag.calibration.flows``)."""
