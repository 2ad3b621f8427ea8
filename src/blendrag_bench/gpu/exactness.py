"""Exactness on the device: tiny random models of every family, each compute path, against HF.

Per family (prompts past every sliding window), with the device's own kernels (``auto``: on
CUDA FlexAttention and the CUDA-graph decoding step) and with the plain ones (SDPA, eager):
float32 full prefill vs HF's forward; blend at ratio 1.0 (three selectors), prefix mode and
single-chunk reuse vs full; 12 greedy tokens vs HF ``generate``; pipelined loading (rows
placed on the reader's stream) bit for bit equal to sequential; a later turn with the history
cache's rows moved to new positions at ratio 1.0 vs full, and a full turn that takes none;
bfloat16 full vs HF within 2^-5 of the largest logit, same argmax. Then a disk tier read to
the device vs RAM. One line per case, ``[PASS]`` or ``[FAIL]``.
"""

from __future__ import annotations

import dataclasses
import tempfile
import traceback
from collections.abc import Callable

import torch
import transformers as T

from blendrag.config import BlendConfig
from blendrag.engine.compute.runner import ComputeConfig
from blendrag.engine.engine import BlendEngine
from blendrag.engine.selection.controller import LoadingConfig
from blendrag.prompt import PromptLayout
from blendrag_bench.gpu.summary import Headlines

TOL = 1e-4
# every mode runs as asked: on CUDA the cost profile would run these tiny models' cached modes
# as full prefills (LoadingConfig.full_when_faster), and so would a request over chunks in no
# store (full_when_missing): a check would compare full with full
AS_ASKED = LoadingConfig(full_when_faster=False, full_when_missing=None)
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
GEMMA = dict(head_dim=16, sliding_window=32, query_pre_attn_scalar=16)
FAMILIES: dict[str, Callable[[], T.PreTrainedModel]] = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**COMMON)),
    "mistral-window32": lambda: T.MistralForCausalLM(T.MistralConfig(**COMMON, sliding_window=32)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**COMMON, head_dim=16)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**COMMON, **GEMMA)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **COMMON, **GEMMA, layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**COMMON, pad_token_id=0)),
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**COMMON)),
}
COMPUTES = {"auto": ComputeConfig(), "sdpa+eager": ComputeConfig(attention="sdpa",
                                                                  decode="eager")}


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


LAYOUT = PromptLayout(_ids(8, 1), [_ids(48, s) for s in (2, 3, 4, 5)], _ids(10, 6))


class Report:
    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit, self.passed, self.failed = emit, 0, 0

    def row(self, case: str, ok: bool, figure: str) -> None:
        self.passed += ok
        self.failed += not ok
        self.emit(f"[{'PASS' if ok else 'FAIL'}] {case}: {figure}")


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float().cpu() - b.float().cpu()).abs().max().item()


def _model(name: str, dtype: torch.dtype, device: str) -> T.PreTrainedModel:
    torch.manual_seed(0)
    model = FAMILIES[name]()
    with torch.no_grad():  # larger weights: cross-chunk effects visible in the logits
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    return model.to(device=device, dtype=dtype).eval()


def _greedy(engine: BlendEngine, steps: int) -> list[int]:
    pre = engine.prefill(LAYOUT, BlendConfig(mode="full"), extra_capacity=steps)
    tokens = [int(pre.logits.argmax())]
    for _ in range(steps - 1):
        tokens.append(int(engine.runner.decode(tokens[-1], pre.fused).argmax()))
    return tokens


@torch.no_grad()
def family(report: Report, name: str, device: str) -> None:
    model = _model(name, torch.float32, device)
    ids = torch.tensor([LAYOUT.ids], device=device)
    hf = model(ids).logits[0, -1]
    ref = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                         eos_token_id=None)[0, ids.shape[1]:].tolist()
    for label, compute in COMPUTES.items():
        engine = BlendEngine(model, None, compute=compute, loading=AS_ASKED)
        case = f"{name} fp32 {label}"
        full = engine.prefill(LAYOUT, BlendConfig(mode="full")).logits
        report.row(f"{case} full vs HF", _diff(full, hf) <= TOL, f"{_diff(full, hf):.1e}")
        for config in (BlendConfig(selector="cacheblend", ratio=1.0),
                       BlendConfig(selector="preview", ratio=1.0),
                       BlendConfig(selector="epic", ratio=1.0), BlendConfig(mode="prefix")):
            got = _prefill(engine, LAYOUT, config).logits
            report.row(f"{case} {config.label} vs full", _diff(got, full) <= TOL,
                       f"{_diff(got, full):.1e}")
        one = PromptLayout(LAYOUT.prefix_ids, LAYOUT.chunk_ids[:1], LAYOUT.suffix_ids)
        a = _prefill(engine, one, BlendConfig(mode="reuse")).logits
        b = engine.prefill(one, BlendConfig(mode="full")).logits
        report.row(f"{case} one-chunk reuse vs full", _diff(a, b) <= TOL, f"{_diff(a, b):.1e}")
        got_tokens = _greedy(engine, 12)
        report.row(f"{case} 12 greedy tokens vs HF generate", got_tokens == ref,
                   f"{got_tokens[:6]} vs {ref[:6]}")
        _pipelined(report, case, model, compute)
        _history(report, case, model, compute)
    _bf16(report, name, device)


def _prefill(engine: BlendEngine, layout: PromptLayout, config: BlendConfig):
    """``engine.prefill``, raising when the request ran another mode than ``config``'s."""
    pre = engine.prefill(layout, config)
    mode = pre.stats.controller.mode
    ran = config.label if mode is None else mode.ran
    if ran != config.label:
        raise RuntimeError(f"{config.label} ran as {ran}: the check would not test it")
    return pre


def _pipelined(report: Report, case: str, model: T.PreTrainedModel,
               compute: ComputeConfig) -> None:
    """Rows read ahead of the loop (a reader thread) give the logits of rows read in it, bit
    for bit. The rows are on a disk tier and the engine has no device tier: rows resident on
    the request's device already (an in-memory store's, the device tier's, or the RAM tier's
    on a CPU) are placed at once and never pipelined (engine/compute/layer_feed.py), so the
    check would compare sequential with sequential; it fails unless every request it counts
    as pipelined was."""
    from blendrag.store import StoreConfig, TieredKVStore

    configs = [BlendConfig(mode="reuse"), BlendConfig(selector="cacheblend", ratio=0.3),
               BlendConfig()]
    with tempfile.TemporaryDirectory() as folder:
        store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=folder, kv_format="model"))
        engine = BlendEngine(model, None, store=store, compute=compute,
                             loading=dataclasses.replace(AS_ASKED, device_tier_bytes=0))
        try:
            engine.precompute(LAYOUT.prefix_ids, LAYOUT.chunk_ids)
            engine.loading = dataclasses.replace(engine.loading, prefetch_layers=0)
            # each config three times: a static pass's shape is captured at its second
            # request (engine/compute/static_pass.py) and replayed from the third on, as below
            sequential = [[_prefill(engine, LAYOUT, c).logits for _ in range(3)][-1]
                          for c in configs]
            engine.loading = dataclasses.replace(engine.loading, prefetch_layers=2)
            pipelined = [_prefill(engine, LAYOUT, c) for c in configs]
        finally:
            store.close()
    same = all(torch.equal(p.logits, s) for p, s in zip(pipelined, sequential))
    ahead = sum(p.stats.loading.pipelined for p in pipelined)
    report.row(f"{case} pipelined == sequential (bit for bit)", same and ahead == len(configs),
               f"reuse, cacheblend, default from a disk tier; {ahead}/{len(configs)} pipelined")


def _history(report: Report, case: str, model: T.PreTrainedModel,
             compute: ComputeConfig) -> None:
    """A second turn over new chunks with the first turn's suffix and 8 decoded tokens after
    them (the history cache's rows, moved to new positions): blend at ratio 1.0 equals a full
    prefill; a full-mode turn takes no history row."""
    engine = BlendEngine(model, None, compute=compute, loading=AS_ASKED, history_bytes=1 << 28)
    plain = BlendEngine(model, None, compute=compute, loading=AS_ASKED)
    answer = _ids(8, seed=7)
    pre = engine.prefill(LAYOUT, BlendConfig(selector="cacheblend", ratio=0.3),
                         extra_capacity=len(answer))
    for token in answer[:-1]:
        engine.runner.decode(token, pre.fused)
    engine.keep_rows([*LAYOUT.ids, *answer], pre)
    del pre  # held, it keeps the pooled KV buffer: the next turn would run in another
    chunks = [_ids(len(c), seed=20 + i) for i, c in enumerate(LAYOUT.chunk_ids)]
    turn = PromptLayout(LAYOUT.prefix_ids, chunks, [*LAYOUT.suffix_ids, *answer, *_ids(6, 9)])
    full = plain.prefill(turn, BlendConfig(mode="full")).logits
    got = _prefill(engine, turn, BlendConfig(selector="cacheblend", ratio=1.0))
    logits, reused = got.logits, got.stats.cache.history_tokens
    del got
    report.row(f"{case} history @1.0 vs full", _diff(logits, full) <= TOL and reused > 0,
               f"{_diff(logits, full):.1e}, {reused} history rows")
    as_full = engine.prefill(turn, BlendConfig(mode="full"))
    report.row(f"{case} full turn takes no history row",
               _diff(as_full.logits, full) <= TOL and as_full.stats.cache.history_tokens == 0,
               f"{_diff(as_full.logits, full):.1e}")


def _bf16(report: Report, name: str, device: str) -> None:
    model = _model(name, torch.bfloat16, device)
    ids = torch.tensor([LAYOUT.ids], device=device)
    hf = model(ids).logits[0, -1]
    tol = hf.float().abs().max().item() / 32
    for label, compute in COMPUTES.items():
        full = BlendEngine(model, None, compute=compute).prefill(
            LAYOUT, BlendConfig(mode="full")).logits
        same = int(full.argmax()) == int(hf.argmax())
        report.row(f"{name} bf16 {label} full vs HF", _diff(full, hf) <= tol and same,
                   f"{_diff(full, hf):.1e} (tol {tol:.1e}), argmax "
                   f"{int(full.argmax())}/{int(hf.argmax())}")


@torch.no_grad()
def disk_tier(report: Report, device: str) -> None:
    from blendrag.store import StoreConfig, TieredKVStore

    model = _model("llama", torch.float32, device)
    config = BlendConfig(selector="cacheblend", ratio=0.3)
    want = _prefill(BlendEngine(model, None, loading=AS_ASKED), LAYOUT, config).logits
    folder = tempfile.mkdtemp()
    for prefetch in (4, 0):
        store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=folder, kv_format="model"))
        loading = dataclasses.replace(AS_ASKED, prefetch_layers=prefetch)
        BlendEngine(model, None, store=store, loading=loading).prefill(
            LAYOUT, BlendConfig(mode="reuse"))  # computes and stores the chunks
        store.close()
        store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=folder, kv_format="model"))
        got = _prefill(BlendEngine(model, None, store=store, loading=loading), LAYOUT, config)
        hits = got.stats.cache.chunk_hits == len(LAYOUT.chunk_ids)
        report.row(f"disk tier -> {device}, prefetch {prefetch}, vs a RAM engine",
                   _diff(got.logits, want) <= TOL and hits,
                   f"{_diff(got.logits, want):.1e}, {got.stats.cache.chunk_hits} hits")
        store.close()


def run(emit: Callable[[str], None], device: str, out: Headlines | None = None) -> Headlines:
    """Every check; ``emit`` takes each line; ``out`` the counts, after each family."""
    out = {} if out is None else out
    report = Report(emit)
    for name in FAMILIES:
        try:
            family(report, name, device)
        except Exception as exc:  # one family's failure must not hide the others
            emit(traceback.format_exc())
            report.row(name, False, f"raised {type(exc).__name__}: {str(exc)[:200]}")
        _counts(out, report)
    try:
        disk_tier(report, device)
    except Exception as exc:
        emit(traceback.format_exc())
        report.row("disk tier", False, f"raised {type(exc).__name__}: {str(exc)[:200]}")
    _counts(out, report)
    return out


def _counts(out: Headlines, report: Report) -> None:
    out["exactness checks failed"] = (report.failed, "0", report.failed == 0)
    out["exactness checks passed"] = (report.passed, "", None)
