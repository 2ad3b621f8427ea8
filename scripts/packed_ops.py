"""Host-level aten calls a request adds to a packed forward, per layer, and those the forward
shares (engine/compute/packed.py), counted on the CPU with torch.profiler: the calls each
packed request makes every layer are a GPU's host work (docs/serving.md).

    .venv/bin/python scripts/packed_ops.py [--layers 16] [--mode reuse|default]

Packs 4 and then 8 requests of a tiny random Mistral-shaped model; what 4 more requests add,
over 4 requests and the layers, is one request's share per layer."""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import MistralConfig, MistralForCausalLM

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.engine.request.packing import run_together
from blendrag.prompt import PromptLayout


class IdsText:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--mode", choices=("reuse", "default"), default="reuse")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=args.layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=32768,
                           sliding_window=None, tie_word_embeddings=False)
    engine = BlendEngine(MistralForCausalLM(config).eval(), tokenizer=None, threads=1)
    engine.tokenizer = IdsText()
    g = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 1000, (n,), generator=g).tolist()

    layouts = [PromptLayout(ids(32), [ids(128) for _ in range(3)], ids(32)) for _ in range(8)]
    for layout in layouts:
        engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)
    blend = BlendConfig(mode="reuse") if args.mode == "reuse" else BlendConfig()
    runner, packed = engine.runner, engine.runner.run_packed
    counts: dict[int, collections.Counter] = {}

    def counted(lanes):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = packed(lanes)
        counts[len(lanes)] = collections.Counter(
            e.name for e in prof.events() if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
        return out

    runner.run_packed = counted
    gen = GenerationConfig(max_new_tokens=1)
    for n in (4, 8):
        run_together(runner, [engine.stream_steps(x, blend, gen) for x in layouts[:n]], 4096)
    four, eight = counts[4], counts[8]
    per_lane = sum(eight.values()) - sum(four.values())
    per_lane /= 4 * args.layers
    shared = (sum(four.values()) - 4 * args.layers * per_lane) / args.layers
    print(f"{args.mode}, {args.layers} layers: a packed request adds {per_lane:.1f} host-level "
          f"aten calls a layer; the forward shares {shared:.1f} a layer")


if __name__ == "__main__":
    main()
