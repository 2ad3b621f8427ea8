"""Evaluation: deviation from full prefill, answer-quality metrics, quality benchmark."""
