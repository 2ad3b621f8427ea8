"""`blendrag cache plan`: which storage tier keeps TTFT at the compute bound for a prompt shape.

The loading controller's second question (engine/selection/controller.py, ``choose_tier``): with
pipelined loading a request takes about layers x max(load per layer, compute per layer); a
tier whose load of one layer hides under the compute of one layer adds nothing to TTFT. Given
the prompt's shape, the model's KV shape, the recompute ratio, the measured compute speed and
the tiers on offer (cheapest first), the command prints each tier's per-layer load and the
pipelined TTFT estimate, and names the cheapest tier that stays at the compute bound.
"""

from __future__ import annotations

import argparse
import math
import sys

from blendrag.cli.options import add_json_option, emit

# cheapest first: an S3 object store (about the loopback Ceph RGW of `bench store --s3`, whole
# entries at 0.52 GB/s, with a 5 ms round trip a read; pass your own store's figures), local NVMe,
# a Redis server on the network, this process's RAM
DEFAULT_TIERS = ("s3=0.4:5000", "disk=3:20", "redis=1:100", "ram=20")


def register(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan", help="which tier keeps TTFT at the compute bound for a prompt shape",
        description="For a prompt shape and the tiers on offer (cheapest first), each tier's "
                    "per-layer load against the per-layer compute of a blend request with "
                    "pipelined loading, and the cheapest tier whose load hides under compute.")
    plan.add_argument("--chunks", type=int, default=6, help="cached chunks (default: 6)")
    plan.add_argument("--chunk-tokens", type=int, default=512, help="tokens a chunk (default: 512)")
    plan.add_argument("--suffix-tokens", type=int, default=64, help="question tokens (default: 64)")
    plan.add_argument("--layers", type=int, default=32,
                      help="model layers (default: 32, Mistral-7B)")
    plan.add_argument("--kv-heads", type=int, default=8, help="KV heads (default: 8, Mistral-7B)")
    plan.add_argument("--head-dim", type=int, default=128,
                      help="head dim (default: 128, Mistral-7B)")
    plan.add_argument("--dtype-bytes", type=int, default=2, help="bytes a value (default: 2, bf16)")
    plan.add_argument("--ratio", type=float, default=0.20, help="recompute ratio (default: 0.20)")
    plan.add_argument("--token-layer-us", type=float, required=True, metavar="US",
                      help="compute of one token through one layer, in microseconds: the "
                           "engine measures it (RequestStats.controller.ratio.token_layer_s, "
                           "or compute_s over the token-layers of `bench ttft --tier`)")
    plan.add_argument("--tier", action="append", default=None, metavar="NAME=GBPS[:US]",
                      help="a tier on offer, cheapest first, with its read bandwidth and "
                           "latency per read (default: " + " ".join(DEFAULT_TIERS) + ")")
    add_json_option(plan, "the figures")
    plan.set_defaults(func=_plan)


def _tier(text: str):
    from blendrag.engine.selection.controller import TierModel

    name, _, speed = text.partition("=")
    bandwidth, _, latency = speed.partition(":")
    try:
        return TierModel(name, float(bandwidth), float(latency or 0))
    except ValueError as exc:
        raise ValueError(f"--tier {text!r}: {exc} (expected NAME=GBPS[:LATENCY_US])") from None


def _plan(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from blendrag.engine.selection.controller import choose_tier, layer_compute_s

    try:
        tiers = [_tier(t) for t in (args.tier or DEFAULT_TIERS)]
        for name in ("chunks", "chunk_tokens", "layers", "kv_heads", "head_dim", "dtype_bytes"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if args.suffix_tokens < 0:
            raise ValueError("--suffix-tokens must be >= 0")
        # (NaN fails every comparison; inf is no measurement)
        if not (0 <= args.ratio <= 1 and 0 < args.token_layer_us < math.inf):
            raise ValueError("--ratio must be in [0, 1] and --token-layer-us a finite number > 0")
    except ValueError as exc:
        print(f"blendrag cache plan: error: {exc}", file=sys.stderr)
        return 2
    cached = args.chunks * args.chunk_tokens
    layer_bytes = 2 * args.kv_heads * args.head_dim * args.dtype_bytes * cached
    compute = layer_compute_s(args.ratio, cached, args.suffix_tokens, args.token_layer_us * 1e-6)
    best, verdicts = choose_tier(tiers, args.layers, layer_bytes, args.chunks, compute)
    lines = [f"{args.chunks} x {args.chunk_tokens} cached tokens, {layer_bytes / 1e6:.1f} MB a "
             f"layer x {args.layers} layers; compute at ratio {args.ratio:g}: "
             f"{compute * 1e3:.2f} ms a layer",
             f"{'tier':<10}{'load ms/layer':>15}{'TTFT ms':>10}  bound"]
    for v in verdicts:
        lines.append(f"{v.tier:<10}{v.load_layer_s * 1e3:>15.2f}{v.ttft_s * 1e3:>10.1f}  "
                     f"{'compute' if v.compute_bound else 'load'}")
    lines.append(f"cheapest tier at the compute bound: {best}" if best else
                 "no tier keeps TTFT at the compute bound: raise the ratio (ratio=auto does) or "
                 "use a faster tier")
    emit(args, {"layer_bytes": layer_bytes, "compute_layer_s": compute, "best": best,
                "tiers": [asdict(v) for v in verdicts]}, "\n".join(lines))
    return 0
