"""What ``bench chat`` runs: its workloads, the configurations of the same-passages workloads,
and the settings of a run (a module of its own: every workload reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from blendrag.config import BlendConfig
from blendrag_bench.ttft import TTFTWorkload

FULL = BlendConfig(mode="full")
CONFIGS: dict[str, tuple[BlendConfig, bool]] = {
    "full+prefix-cache": (FULL, True),
    "blend+prefix-cache": (BlendConfig(), True),
    "blend": (BlendConfig(), False),
}
"""The text and random workloads' configurations: name -> (config, whether the engine has a
prefix cache)."""

WORKLOADS = ("text", "random", "history", "random-history")


@dataclass(frozen=True)
class ChatBenchConfig:
    """``workloads``: of ``WORKLOADS``; ``model``, ``gguf_file``, ``dtype``,
    ``device``: the text workload's model (None: the default model); ``random``: the random
    workload's shape; ``turns``; ``answer_tokens``: each answer's length (the text workload
    stops earlier at the model's end of turn);
    ``cache_bytes``: each prefix cache's budget; ``runs``: conversations per configuration (the
    median TTFT per turn is reported); ``passages``, ``passage_tokens``: the text workload's
    passages and their length cap (None: whole; the cap holds for the history workload too);
    ``turn_passages``: the history workload's passages per turn."""

    workloads: tuple[str, ...] = ("text", "random")
    model: str | None = None
    gguf_file: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    random: TTFTWorkload = field(default_factory=lambda: TTFTWorkload(suffix_tokens=32))
    turns: int = 5
    answer_tokens: int = 32
    cache_bytes: int = 2 << 30
    runs: int = 1
    configs: tuple[str, ...] = tuple(CONFIGS)
    passages: int = 6
    passage_tokens: int | None = None
    turn_passages: int = 2

    def __post_init__(self) -> None:
        for name in ("turns", "answer_tokens", "cache_bytes", "runs", "passages",
                     "turn_passages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.passage_tokens is not None and self.passage_tokens < 1:
            raise ValueError(f"passage_tokens must be >= 1, got {self.passage_tokens}")
        unknown = set(self.workloads) - set(WORKLOADS) or set(self.configs) - set(CONFIGS)
        if unknown or not self.workloads or not self.configs:
            raise ValueError(f"unknown or no workloads/configs: {sorted(unknown)}; workloads "
                             f"are {', '.join(WORKLOADS)}; configs are {', '.join(CONFIGS)}")
