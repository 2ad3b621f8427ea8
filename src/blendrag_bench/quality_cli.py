"""`blendrag bench quality`: answer quality vs TTFT of every mode and selector on a dataset.

``blendrag_bench.cli`` adds it to the ``bench`` group.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blendrag.calibration import FLOWS
from blendrag.cli.options import (
    add_chat_option,
    add_json_option,
    add_model_options,
    add_profile_neighbours_option,
    add_progress_option,
    csv_of,
)
from blendrag.cli.progress import Progress
from blendrag.config import DEFAULT_BLEND, MODES, SELECTORS, Ape
from blendrag_bench.ratios import DEFAULT_FIDELITY_RATIOS, DEFAULT_RATIOS

DEFAULT_DATASETS = ("synthetic", "musique")
# a default run of both: under 30 min on 2 CPU cores
DEFAULT_LIMITS = {"synthetic": 40, "musique": 6, "longfacts": 40}


def _ape(text: str) -> Ape | None:
    """``none``, or ``TxS``: APE's temperature and scale."""
    if text.strip() == "none":
        return None
    t, sep, scale = text.strip().partition("x")
    if not sep:
        raise ValueError(f"an APE setting is TxS (e.g. 0.9x1.0) or none, got {text!r}")
    return Ape(temperature=float(t), scale=float(scale))


def register(bench: argparse._SubParsersAction) -> None:
    """Add ``quality`` to the ``blendrag bench`` group."""
    q = bench.add_parser(
        "quality", help="answer quality vs TTFT of every mode and selector",
        description="Answer quality against TTFT of every mode, selector and recompute ratio on "
                    "question sets; writes a table and a plot per dataset. Long on a CPU: the "
                    "progress line says how long.")
    q.add_argument("--dataset", type=csv_of(str), default=DEFAULT_DATASETS,
                   help="comma-separated: 'synthetic' (generated multi-passage questions), "
                        "'musique' (shipped "
                        "MuSiQue subset, 6 passages each), 'longfacts' (facts among 6 real-text "
                        "passages, ~1,900 tokens), a CacheBlend .json or a LongBench "
                        f".jsonl file (default: {','.join(DEFAULT_DATASETS)})")
    add_model_options(q)
    add_chat_option(q)
    q.add_argument(
        "--limit",
        type=int,
        help="items per dataset (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_LIMITS.items())
        + ", every item of a file)",
    )
    q.add_argument("--max-chunk-tokens", type=int, default=512,
                   help="cut each passage after a word to at most this many tokens (default 512, "
                        "as the CacheBlend paper); 0: no cut")
    q.add_argument("--offset", type=int, default=0, help="items to skip first (default: 0)")
    q.add_argument("--modes", type=csv_of(str), default=MODES,
                   help=f"comma-separated subset of {','.join(MODES)} (default: all)")
    q.add_argument("--selectors", type=csv_of(str), default=tuple(SELECTORS),
                   help=f"comma-separated subset of {','.join(SELECTORS)} (default: all)")
    q.add_argument("--ratios", type=csv_of(float), default=DEFAULT_RATIOS,
                   help="comma-separated recompute ratios of blend (default: "
                        + ",".join(f"{r:g}" for r in DEFAULT_RATIOS) + ")")
    q.add_argument("--spans", type=csv_of(int), default=(1,),
                   help="comma-separated windows the preview selector recomputes its tokens in "
                        "(PreviewOptions.span; default: 1, single tokens)")
    q.add_argument("--ape", type=csv_of(_ape), default=(None,),
                   help="comma-separated APE settings TxS (temperature x scale) each blend "
                        "config also runs with, 'none' for without (BlendConfig.ape; default: "
                        "none)")
    q.add_argument("--max-new-tokens", type=int, default=16,
                   help="answer length limit in tokens: the answer compared with full "
                        "prefill's (default: 16)")
    q.add_argument("--ingest-order", default="prompt", choices=["prompt", "shuffled"],
                   help="order chunks are precomputed in: the neighbour each context profile is "
                        "measured "
                        "after (prompt: the chunk before it in the prompt; shuffled: a seeded "
                        "shuffle) (default: prompt)")
    add_profile_neighbours_option(
        q, default=1, what="measure each context profile after each of the K chunks before it "
                           "in the ingestion order, keeping each token's largest deviation")
    q.add_argument("--no-warmup", action="store_true",
                   help="time the first item's configs cold (default: one warm-up item first)")
    q.add_argument("--out-dir", type=Path, default=Path("runs/quality"),
                   help="where <dataset>/table.md, table.csv and quality_vs_ttft.png go "
                        "(default: runs/quality)")
    add_progress_option(q)
    add_json_option(q, "the per-config records of every dataset")
    q.set_defaults(func=_quality)


def _quality(args: argparse.Namespace) -> int:
    import json

    from blendrag.cli.options import apply_threads
    from blendrag_bench.named_datasets import dataset_name, load_dataset
    from blendrag_bench.quality import QualityConfig, load_engine, run_quality
    from blendrag_bench.report import format_markdown, records, write_report

    try:
        config = QualityConfig(model=args.model, gguf_file=args.gguf_file,
                               device=args.device or "cpu",
                               dtype=args.dtype, chat=args.chat, modes=args.modes,
                               selectors=args.selectors, spans=args.spans, apes=args.ape,
                               ratios=args.ratios, max_new_tokens=args.max_new_tokens,
                               warmup=not args.no_warmup,
                               ingest_order=args.ingest_order,
                               profile_neighbours=args.profile_neighbours,
                               max_chunk_tokens=args.max_chunk_tokens or None)
        datasets = [(dataset_name(d), load_dataset(d, limit=_limit(args, d), offset=args.offset))
                    for d in args.dataset]
        apply_threads(args)
        engine = load_engine(config)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"blendrag bench quality: error: {e}", file=sys.stderr)
        return 2
    all_records: list[dict] = []
    for name, items in datasets:
        print(f"{name}: {len(items)} items x {len(config.configs())} configs on {config.model}",
              file=sys.stderr)
        try:
            report = run_quality(items, config, engine=engine, dataset=name,
                                 on_item=Progress(name, "items", enabled=not args.no_progress))
        except ValueError as e:
            print(f"blendrag bench quality: error: {e}", file=sys.stderr)
            return 2
        paths = write_report(report, args.out_dir / name)
        if args.json != "-":
            print(format_markdown(report) + "\n")
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
        all_records += [{"dataset": name, "model": config.model, **r} for r in records(report)]
        if args.json and args.json != "-":  # after every dataset: a long run keeps what it did
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(all_records, indent=2))
    if args.json == "-":
        print(json.dumps(all_records, indent=2))
    elif args.json:
        print(f"wrote {args.json} ({len(all_records)} records)", file=sys.stderr)
    return 0


def _limit(args: argparse.Namespace, dataset: str) -> int | None:
    return args.limit if args.limit is not None else DEFAULT_LIMITS.get(dataset)


def register_fidelity(bench: argparse._SubParsersAction) -> None:
    """Add ``fidelity`` to the ``blendrag bench`` group: the frontier on your own prompts."""
    f = bench.add_parser(
        "fidelity", help="how close blend stays to full prefill on your model and prompts",
        description="Full prefill, full KV reuse and blend at each ratio on your own prompts: "
                    "per config the share of prompts whose whole answer is full prefill's, the "
                    "answer KL (teacher-forced on full's answer), compute and TTFT; then the "
                    "smallest ratio per selector that meets the fidelity you ask for.")
    f.add_argument("--prompts", type=Path, required=True,
                   help="JSON lines, one prompt each: {\"prefix\": ..., \"chunks\": [...], "
                        "\"suffix\": ...}, optionally \"answers\": [...]")
    f.add_argument("--limit", type=int, default=None, help="prompts to use (default: all)")
    add_model_options(f)
    add_chat_option(f)
    f.add_argument("--selectors", type=csv_of(str), default=(DEFAULT_BLEND.selector,),
                   help=f"comma-separated subset of {','.join(SELECTORS)} (default: "
                        f"{DEFAULT_BLEND.selector})")
    f.add_argument("--ratios", type=csv_of(float), default=DEFAULT_FIDELITY_RATIOS,
                   help="comma-separated recompute ratios (default: "
                        + ",".join(f"{r:g}" for r in DEFAULT_FIDELITY_RATIOS) + ")")
    f.add_argument("--same-answer", type=float, default=0.90,
                   help="the share of prompts that must get full prefill's answer (default 0.90)")
    f.add_argument("--answer-kl", type=float, default=0.02,
                   help="the largest mean answer KL accepted (default 0.02)")
    f.add_argument("--max-new-tokens", type=int, default=16,
                   help="answer length compared, in tokens (default: 16)")
    f.add_argument("--flow", choices=FLOWS, default=FLOWS[0],
                   help="what to run, as your application does: 'integration' (LangChain's and "
                        "LlamaIndex's BlendLLM: prefix + the chunks joined with a blank line + "
                        "suffix, laid out by the integration client, chunk KVs after the chunk "
                        "prefix); 'engine' (BlendEngine.ingest(chunks, prefix=prefix) + "
                        "build_prompt: chunk KVs after each prompt's own prefix unless "
                        "--chunk-prefix is given) (default: integration)")
    f.add_argument("--chunk-prefix", default=None, metavar="TEXT",
                   help="the engine's chunk_prefix, as your engine has it (default: '' for "
                        "--flow integration, as BlendLLM.from_pretrained sets it; none for "
                        "--flow engine)")
    f.add_argument("--show-answers", action="store_true",
                   help="also print every config's answer to every prompt")
    add_progress_option(f)
    f.set_defaults(func=_fidelity)


def _fidelity(args: argparse.Namespace) -> int:
    from blendrag.cli.options import apply_threads
    from blendrag_bench.fidelity import (
        FidelityTarget,
        answer_lines,
        check_fidelity,
        load_prompts,
    )
    from blendrag_bench.quality import QualityConfig, load_engine
    from blendrag_bench.report import format_markdown

    chunk_prefix = args.chunk_prefix
    if chunk_prefix is None and args.flow == "integration":
        chunk_prefix = ""
    try:
        target = FidelityTarget(args.same_answer, args.answer_kl)
        items = load_prompts(args.prompts, args.limit)
        QualityConfig(selectors=args.selectors, ratios=args.ratios,
                      max_new_tokens=args.max_new_tokens)  # checks them, before the model loads
        apply_threads(args)
        engine = load_engine(QualityConfig(model=args.model, gguf_file=args.gguf_file,
                                           device=args.device or "cpu", dtype=args.dtype,
                                           chat=args.chat), chunk_prefix=chunk_prefix)
        check = check_fidelity(engine, items, args.selectors, args.ratios, target,
                               args.max_new_tokens,
                               Progress("prompts", "prompts", enabled=not args.no_progress),
                               flow=args.flow, model=args.model)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"blendrag bench fidelity: error: {e}", file=sys.stderr)
        return 2
    print(format_markdown(check.report) + "\n")
    if args.show_answers:
        print("\n".join(answer_lines(check.report)) + "\n")
    print("\n".join(check.lines()))
    return 0
