"""The recompute ratios the quality and fidelity benchmarks sweep unless told otherwise (a
module of its own: the benchmarks and their command-line front end both read them)."""

DEFAULT_RATIOS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.30, 0.50)
"""``bench quality``'s."""

DEFAULT_FIDELITY_RATIOS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7)
"""``bench fidelity``'s."""
