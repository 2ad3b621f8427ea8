"""Evaluation metrics a user needs: answer quality against gold answers, first-token agreement
with the full prefill, and the attention deviation of a mode from it. The quality benchmark that
uses them is ``blendrag_bench``."""
