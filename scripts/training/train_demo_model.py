#!/usr/bin/env python
"""Train the embedded demo model (a tiny Llama) on the synthetic multi-document QA corpus.

Every training sequence is the exact prompt the engine builds, tokenized piece by piece
(``PREFIX`` with BOS, each ``format_chunk(passage)``, ``format_suffix(question)``), then the
answer and EOS. To get more signal per forward pass, further questions about the same
passages follow the first answer's EOS (suffix, answer, EOS each). The number of passages
grows over training (curriculum); the learning rate warms up, then follows a cosine.

Losses: cross-entropy on answer and EOS tokens; a small LM loss on the prompt tokens; and an
attention-supervision loss: at every position that predicts an answer token, one head of the
last layer is trained to attend to that token's occurrences in the passages (-log of its
attention mass there). Three things made a from-scratch model learn in-context lookup within
a few CPU minutes, where plain training sat on a plateau (right answer type, wrong entity):

- input embeddings at unit scale (``embed_std``), untied from an output head initialized
  aligned with them: with the usual 0.02 scale the layers' outputs (norm 10-40 after a few
  steps) wash the token identity out of the residual stream, so there is nothing to copy;
- copy-head init (``copy_head_init``): value/output maps start as a projection, so a head
  that attends to a token writes that token's embedding direction;
- the attention supervision above, which teaches *where* to look directly.

The result is a plain ``LlamaForCausalLM``; none of this changes inference.
Held-out accuracy is measured on ``generate_examples(n, HELDOUT_SEED, num_chunks=(4, 6))``:
the answer counts when greedy decoding after a full prefill yields the gold answer then EOS
(checked teacher-forced, which is the same thing, and confirmed with ``model.generate`` on a
sample).

Continuing a trained model (``--init DIR``), it can also be deepened with identity-initialized
layers (``--grow``), given a bridge-fact attention loss for two-passage questions
(``--evidence-weight``, ``evidence_positions``) and a monotone year direction in its
embeddings (``--year-axis``); the shipped model's TRAINING.md records what these gave.

Usage: ``python scripts/training/train_demo_model.py [--steps N] [--out DIR]``; single-threaded
unless ``--threads``.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from blendrag_demo.corpus import (
    HELDOUT_SEED,
    KINDS,
    QAExample,
    encode_pieces,
    encode_prompt,
    exact_match,
    format_suffix,
    generate_examples,
    prompt_pieces,
)
from demo_facts import read_facts
from demo_tokenizer import build_tokenizer
from training_data import TRAIN_SEED_BASE, generate_question_groups

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "src" / "blendrag_demo" / "model"
IGNORE = -100


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (defaults: the shipped model)."""

    steps: int = 1700
    batch_size: int = 8
    # at most; rows are filled up to fill_tokens past the longest prompt
    questions_per_group: int = 24
    fill_tokens: int = 120
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 80
    weight_decay: float = 0.01
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    seed: int = 0
    max_len: int = 512
    eval_n: int = 300
    eval_every: int = 425
    lm_weight: float = 0.1  # LM loss on prompt tokens, relative to the answer loss
    embed_std: float = 1.0  # input embedding init scale
    tie_embeddings: bool = False
    copy_init: float = 50.0  # gain of the copy-head init of value/output maps (0: HF default init)
    attn_weight: float = 1.0  # weight of the attention-supervision loss (0: off)
    attn_heads: int = 1  # heads of the last layer the attention loss applies to
    max_minutes: float = 0.0  # stop early after this wall time (0: no limit)
    # a saved model directory to continue from ("": fresh init); its TRAINING.md is kept
    init: str = ""
    data_offset: int = 0  # added to the training data seeds, so that a continuation sees new data
    # e.g. "single=0.2,pronoun=0.2,comparison=0.4,multihop=0.2" ("": corpus default)
    kind_weights: str = ""
    # with init: new layer plan, e.g. "0,1,2,new,new,3" (old layer indices; "new": identity layer)
    grow: str = ""
    threads: int = 1  # torch CPU threads
    # grow the passage count over training (off: 2-6 passages from the start)
    curriculum: bool = True
    # weight of the bridge-fact attention loss (0: off), see evidence_positions
    evidence_weight: float = 0.0
    evidence_layer: int = -2  # the layer whose heads 0 (and 1) that loss applies to
    # add a monotone "year" direction of this norm to year-token embeddings (0: off)
    year_axis: float = 0.0

    def weights(self) -> dict[str, float] | None:
        """``kind_weights`` parsed (None: the corpus default)."""
        if not self.kind_weights:
            return None
        pairs = [item.split("=") for item in self.kind_weights.split(",")]
        if any(len(p) != 2 or p[0] not in KINDS for p in pairs):
            raise ValueError("kind_weights must look like 'single=0.3,pronoun=0.3,...' over "
                             f"{KINDS}")
        return {k: float(v) for k, v in pairs}

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.questions_per_group < 1:
            raise ValueError("steps, batch_size and questions_per_group must be >= 1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must divide by heads and heads by kv_heads")
        if self.grow and not self.init:
            raise ValueError("grow needs init: it deepens a trained model")
        if self.grow and any(x != "new" and not x.isdigit() for x in self.grow.split(",")):
            raise ValueError(f"grow must list old layer indices and 'new', got {self.grow!r}")
        if self.threads < 1:
            raise ValueError("threads must be >= 1")


def chunk_range(step: int, steps: int, curriculum: bool = True) -> tuple[int, int]:
    """Curriculum: passage-count range of the batch at ``step``."""
    if not curriculum:
        return (2, 6)
    frac = step / steps
    if frac < 0.15:
        return (1, 3)
    if frac < 0.3:
        return (2, 4)
    if frac < 0.45:
        return (3, 5)
    return (2, 6)


Row = tuple[list[int], list[int], list[tuple[int, int, int]], list[tuple[int, int, int]]]


def evidence_positions(tok: Any, ex: QAExample, starts: Sequence[int],
                       ids: Sequence[int]) -> list[tuple[int, int]]:
    """``(head, position)`` of the bridge facts a two-passage question hinges on (none for
    other kinds): head h of the evidence layer should look at that position.

    comparison "Who is older, A or B?": head 0 at A's birth-year token, head 1 at B's (each a
    plain lookup, as for "In which year was A born?"; the comparison is then left to the
    layers above; in a pronoun-led passage the year is bound to the name only through the
    passage before); multihop: head 0 at the employer's name in the person's own passage
    (the hop to the company passage). ``starts``: each passage's first position in ``ids``.
    """
    facts = read_facts(ex.chunks)
    if ex.kind == "comparison":
        people = re.match(r"Who is \w+, (\w+ \w+) or (\w+ \w+)\?", ex.question).groups()  # type: ignore[union-attr]
        wanted = [(p, facts[p]["year"]) for p in people]
    elif ex.kind == "multihop":
        person = re.search(r"employer of (\w+ \w+)", ex.question).group(1)  # type: ignore[union-attr]
        wanted = [(person, facts[person]["employer"])]
    else:
        return []
    out = []
    for head, (owner, value) in enumerate(wanted):
        token = tok(value, add_special_tokens=False)["input_ids"][0]
        for j in ex.support:
            if ex.kind == "multihop" and owner not in ex.chunks[j]:
                continue  # the company's own passage names it too: the hop starts in the person's
            end = starts[j + 1] if j + 1 < len(starts) else len(ids)
            hits = [p for p in range(starts[j], end) if ids[p] == token]
            if hits:
                out.append((head, hits[0]))
                break
    return out


def encode_group(tok: Any, group: Sequence[QAExample], width: int) -> Row:
    """Ids, labels and attention targets of one training sequence.

    The prompt, then as many of the group's questions (suffix, answer, EOS) as fit in
    ``width`` tokens (the first one always). Attention targets are ``(query position,
    answer token id, prompt length)`` for every answer token but EOS: the position that
    predicts the token should look at that token's occurrences in the passages.
    """
    head = group[0]
    prefix, chunks, _ = encode_pieces(tok, prompt_pieces(head.chunks, head.question))
    ids = prefix + [t for c in chunks for t in c]
    context = len(ids)
    starts = [len(prefix) + sum(len(c) for c in chunks[:j]) for j in range(len(chunks))]
    labels = [IGNORE] * len(ids)
    targets: list[tuple[int, int, int]] = []
    evidence: list[tuple[int, int, int]] = []
    for i, ex in enumerate(group):
        suffix = list(tok(format_suffix(ex.question), add_special_tokens=False)["input_ids"])
        answer = list(tok(ex.answers[0], add_special_tokens=False)["input_ids"])
        if i > 0 and len(ids) + len(suffix) + len(answer) + 1 > width:
            break
        ids += suffix
        targets += [(len(ids) - 1 + j, t,
                     context) for j, t in enumerate(answer) if t in ids[:context]]
        evidence += [
            (len(ids) - 1, h, key) for h, key in evidence_positions(tok, ex, starts, ids[:context])
        ]
        ids += answer + [tok.eos_token_id]
        labels += [IGNORE] * len(suffix) + answer + [tok.eos_token_id]
    return ids, labels, targets, evidence


def make_batch(
    tok: Any, groups: Sequence[Sequence[QAExample]], cfg: TrainConfig
) -> dict[str, torch.Tensor]:
    """One training batch; rows are filled with questions up to a common width."""
    longest = max(len(encode_prompt(tok, g[0].chunks, g[0].question)) for g in groups)
    width = min(cfg.max_len, longest + cfg.fill_tokens)
    return collate([encode_group(tok, g, width) for g in groups], tok.pad_token_id)


def collate(rows: Sequence[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch tensors (``attn_targets``: rows of (batch row, query, token, prompt
    length))."""
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    targets = [(r, q, t, c) for r, row in enumerate(rows) for q, t, c in row[2]]
    evidence = [(r, q, h, k) for r, row in enumerate(rows) for q, h, k in row[3]]
    for r, (row_ids, row_labels, _, _) in enumerate(rows):
        ids[r, : len(row_ids)] = torch.tensor(row_ids)
        labels[r, : len(row_labels)] = torch.tensor(row_labels)
        mask[r, : len(row_ids)] = 1
    attn_targets = torch.tensor(targets, dtype=torch.long).reshape(-1, 4)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask,
            "attn_targets": attn_targets,
            "evidence": torch.tensor(evidence, dtype=torch.long).reshape(-1, 4)}


def evidence_loss(attentions: Sequence[torch.Tensor], batch: dict[str, torch.Tensor],
                  layer: int) -> torch.Tensor:
    """-log of the attention the heads of ``layer`` put on the bridge facts
    (``evidence_positions``) from the position that predicts the answer's first token."""
    e = batch["evidence"]
    if e.numel() == 0:
        return attentions[layer].sum() * 0.0
    rows, queries, heads, keys = e.unbind(-1)
    return -attentions[layer][rows, heads, queries, keys].clamp_min(1e-6).log().mean()


def attention_loss(attentions: Sequence[torch.Tensor], batch: dict[str, torch.Tensor],
                   heads: int) -> torch.Tensor:
    """-log of the attention mass the first ``heads`` heads of the last layer put on the answer
    token's occurrences in the passages, at the positions that predict answer tokens."""
    t = batch["attn_targets"]
    if t.numel() == 0:
        return attentions[-1].sum() * 0.0
    rows, queries, tokens, context = t.unbind(-1)
    probs = attentions[-1][rows, :heads, queries, :]  # [N, heads, T]
    keys = batch["input_ids"][rows]
    positions = torch.arange(keys.shape[1])
    hit = (keys == tokens[:, None]) & (positions[None, :] < context[:, None])
    mass = (probs * hit[:, None, :]).sum(-1).clamp_min(1e-6)
    return -mass.log().mean()


def build_model(cfg: TrainConfig, tok: Any) -> LlamaForCausalLM:
    """A freshly initialized tiny Llama for the tokenizer's vocabulary."""
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    # Eager attention returns the attention probabilities for the attention loss; the
    # saved config does not pin it, so loading picks the default (SDPA).
    config._attn_implementation = "eager" if cfg.attn_weight > 0 else "sdpa"
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Token identity must survive in the residual stream next to the layers' outputs
        # (norm ~10-40 after a few steps): start the input embeddings at unit scale.
        model.get_input_embeddings().weight.normal_(0.0, cfg.embed_std)
        if not cfg.tie_embeddings:
            # Start the output head aligned with the input embeddings (as if tied, at the
            # usual 0.02 scale): a head that copies a token's embedding then raises that
            # token's logit for every token at once.
            model.get_output_embeddings().weight.copy_(
                model.get_input_embeddings().weight * (0.02 / cfg.embed_std)
            )
    if cfg.copy_init > 0:
        copy_head_init(model, cfg.seed, cfg.copy_init)
    return model


def load_model(cfg: TrainConfig) -> LlamaForCausalLM:
    """A saved model to continue training (eager attention: the attention loss reads the
    probabilities)."""
    attn = "eager" if cfg.attn_weight > 0 else "sdpa"
    model = LlamaForCausalLM.from_pretrained(cfg.init, attn_implementation=attn)
    return grow_layers(model, cfg.grow.split(","), cfg.seed) if cfg.grow else model


@torch.no_grad()
def add_year_axis(model: LlamaForCausalLM, tok: Any, norm: float, seed: int) -> int:
    """Give every year token's input embedding a component along one random direction,
    proportional to the year (-norm for the earliest, +norm for the latest): "who is older"
    then needs a comparison along one axis instead of an order learned over 150 unrelated
    embeddings from two-candidate questions alone, which a small model did not learn on a CPU
    budget. Returns how many tokens were changed."""
    vocab = tok.get_vocab()
    years = {int(w): i for w, i in vocab.items() if w.isdigit() and len(w) == 4}
    gen = torch.Generator().manual_seed(seed + 5)
    emb = model.get_input_embeddings().weight
    axis = torch.randn(emb.shape[1], generator=gen)
    axis /= axis.norm()
    lo, hi = min(years), max(years)
    for year, i in years.items():
        emb[i] += norm * (2 * (year - lo) / (hi - lo) - 1) * axis
    return len(years)


@torch.no_grad()
def grow_layers(model: LlamaForCausalLM, plan: Sequence[str], seed: int) -> LlamaForCausalLM:
    """A deeper model that computes the same function: layer ``i`` of the new stack is old layer
    ``int(plan[i])`` or, for ``"new"``, a fresh layer whose attention output and MLP down
    projections are zero (an identity block on the residual stream), so training resumes from
    the old model's accuracy and the new layers only add what the loss asks of them."""
    old = model.model.layers
    if any(p != "new" and not 0 <= int(p) < len(old) for p in plan):
        raise ValueError(f"grow plan {list(plan)} names a layer outside 0..{len(old) - 1}")
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = len(plan)
    config._attn_implementation = model.config._attn_implementation
    torch.manual_seed(seed + 3)
    grown = LlamaForCausalLM(config)
    grown.model.embed_tokens.load_state_dict(model.model.embed_tokens.state_dict())
    grown.model.norm.load_state_dict(model.model.norm.state_dict())
    grown.lm_head.load_state_dict(model.lm_head.state_dict())
    for i, p in enumerate(plan):
        layer = grown.model.layers[i]
        if p == "new":
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        else:
            layer.load_state_dict(old[int(p)].state_dict())
    return grown


@torch.no_grad()
def copy_head_init(model: LlamaForCausalLM, seed: int, gain: float = 1.0) -> None:
    """Initialize every attention head's value/output maps as a copy of a random subspace.

    ``v_proj`` rows become orthonormal and each head's ``o_proj`` block their transpose
    times ``gain * initializer_range``, so that attending to a token writes (a projection
    of) that token's own residual direction back: in-context copying then needs only the
    right attention pattern, which is what the task has to learn. Without it the OV maps
    start ~1000x too small and the copy did not form within a CPU budget.
    """
    gen = torch.Generator().manual_seed(seed + 2)
    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    scale = gain * cfg.initializer_range
    for layer in model.model.layers:
        attn = layer.self_attn
        basis, _ = torch.linalg.qr(torch.randn(cfg.hidden_size, cfg.hidden_size, generator=gen))
        v = basis[:, : cfg.num_key_value_heads * hd].T.contiguous()
        attn.v_proj.weight.copy_(v)
        for h in range(cfg.num_attention_heads):
            kv = h // group
            attn.o_proj.weight[:, h * hd : (h + 1) * hd] = v[kv * hd : (kv + 1) * hd].T * scale


def loss_fn(logits: torch.Tensor, batch: dict[str, torch.Tensor],
            lm_weight: float) -> tuple[torch.Tensor, float]:
    """Cross-entropy on answer tokens plus ``lm_weight`` times the LM loss on prompt tokens;
    returns the total and the answer part (for the log)."""
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    labels = batch["labels"][:, 1:].reshape(-1)
    answer_loss = torch.nn.functional.cross_entropy(shift_logits, labels, ignore_index=IGNORE)
    loss = answer_loss
    if lm_weight > 0:
        lm = batch["input_ids"][:, 1:].clone()
        lm[(batch["attention_mask"][:, 1:] == 0) | (batch["labels"][:, 1:] != IGNORE)] = IGNORE
        loss = loss + lm_weight * torch.nn.functional.cross_entropy(
            shift_logits, lm.reshape(-1), ignore_index=IGNORE
        )
    return loss, answer_loss.item()


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine down to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (
        cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
    )


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, tok: Any, examples: Sequence[QAExample],
             batch_size: int = 32) -> dict[str, float]:
    """Exact-match accuracy of greedy decoding after full prefill, overall and by kind.

    Greedy decoding yields exactly the gold answer and EOS iff the argmax at every answer
    position (fed the gold prefix) is the gold token, so one teacher-forced forward decides.
    """
    model.eval()
    hits: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for start in range(0, len(examples), batch_size):
        part = examples[start : start + batch_size]
        rows = [_eval_row(tok, ex) for ex in part]
        batch = collate(rows, tok.pad_token_id)
        logits = model(input_ids=batch["input_ids"]).logits  # right padding: causal mask suffices
        pred = logits[:, :-1].argmax(-1)
        gold = batch["labels"][:, 1:]
        ok = ((pred == gold) | (gold == IGNORE)).all(dim=1)
        for ex, good in zip(part, ok.tolist()):
            totals[ex.kind] += 1
            hits[ex.kind] += int(good)
    model.train()
    result = {k: hits[k] / totals[k] for k in KINDS if totals[k]}
    result["overall"] = sum(hits.values()) / max(1, sum(totals.values()))
    return result


def _eval_row(tok: Any, ex: QAExample) -> Row:
    prompt = encode_prompt(tok, ex.chunks, ex.question)
    answer = list(tok(ex.answers[0], add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    return prompt + answer, [IGNORE] * len(prompt) + answer, [], []


@torch.no_grad()
def generate_accuracy(model: LlamaForCausalLM, tok: Any, examples: Sequence[QAExample]) -> float:
    """Exact-match accuracy with a plain ``model.generate`` greedy decode, one example at a time."""
    model.eval()
    hits = 0
    for ex in examples:
        ids = torch.tensor([encode_prompt(tok, ex.chunks, ex.question)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             do_sample=False)
        hits += exact_match(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
                            ex.answers)
    model.train()
    return hits / max(1, len(examples))


def train(cfg: TrainConfig, out: Path | None, log_every: int = 25) -> dict[str, Any]:
    """Run training; save model and tokenizer to ``out`` when given. Returns a summary."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tok = build_tokenizer()
    model = build_model(cfg, tok) if not cfg.init else load_model(cfg)
    if cfg.year_axis > 0:
        print(f"year axis of norm {cfg.year_axis} added to "
              f"{add_year_axis(model, tok, cfg.year_axis, cfg.seed)} year tokens")
    model.train()
    opt = make_optimizer(model, cfg)
    heldout = generate_examples(cfg.eval_n, HELDOUT_SEED, num_chunks=(4, 6))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params={n_params} config={asdict(cfg)}", flush=True)
    start = time.perf_counter()
    history: list[dict[str, Any]] = []
    tokens = 0
    for step in range(cfg.steps):
        groups = generate_question_groups(
            cfg.batch_size, TRAIN_SEED_BASE + cfg.data_offset + step,
            chunk_range(step, cfg.steps, cfg.curriculum),
            cfg.questions_per_group, kind_weights=cfg.weights(),
        )
        batch = make_batch(tok, groups, cfg)
        tokens += int(batch["attention_mask"].sum())
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        # Right padding under a causal mask: real tokens never see pads, so no attention mask
        # is needed (and SDPA keeps its fast causal path).
        result = model(input_ids=batch["input_ids"],
                       output_attentions=cfg.attn_weight > 0 or cfg.evidence_weight > 0)
        loss, answer_loss = loss_fn(result.logits, batch, cfg.lm_weight)
        attn_loss = attention_loss(result.attentions, batch,
                                   cfg.attn_heads) if cfg.attn_weight > 0 else torch.zeros(())
        loss = loss + cfg.attn_weight * attn_loss
        ev_loss = evidence_loss(result.attentions, batch,
                                cfg.evidence_layer) if cfg.evidence_weight > 0 else torch.zeros(())
        loss = loss + cfg.evidence_weight * ev_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == cfg.steps - 1:
            print(
                f"step {step} loss {loss.item():.4f} answer {answer_loss:.4f} attn "
                f"{attn_loss.item():.4f} evidence {ev_loss.item():.4f} lr {lr_at(step, cfg):.2e} "
                f"chunks {chunk_range(step, cfg.steps, cfg.curriculum)} "
                f"t {time.perf_counter() - start:.0f}s",
                flush=True,
            )
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            acc = evaluate(model, tok, heldout)
            history.append({"step": step + 1, "time_s": round(time.perf_counter() - start, 1),
                            **acc})
            print(f"eval step {step + 1}: " + " ".join(f"{k}={v:.3f}" for k, v in acc.items()),
                  flush=True)
        if cfg.max_minutes and time.perf_counter() - start > cfg.max_minutes * 60:
            print(f"time budget of {cfg.max_minutes} min reached at step {step + 1}", flush=True)
            history.append({"step": step + 1, "time_s": round(time.perf_counter() - start, 1),
                            **evaluate(model, tok, heldout)})
            break
    wall = time.perf_counter() - start
    gen_acc = generate_accuracy(model, tok, heldout[:100])
    arch = {k: getattr(model.config, k) for k in ("num_hidden_layers", "hidden_size",
                                                  "intermediate_size", "num_attention_heads",
                                                  "num_key_value_heads")}
    summary = {"arch": arch, "params": n_params, "wall_s": wall, "tokens": tokens,
               "history": history, "generate_acc_100": gen_acc, "config": asdict(cfg)}
    print(f"done in {wall:.0f}s; generate() accuracy on 100 held-out: {gen_acc:.3f}", flush=True)
    if out is not None:
        save(model, tok, out, summary)
    return summary


def save(model: LlamaForCausalLM, tok: Any, out: Path, summary: dict[str, Any]) -> None:
    """Write weights (safetensors), config, generation config, tokenizer and TRAINING.md."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=False, max_new_tokens=8,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    text = report(summary)
    previous = (
        Path(summary["config"]["init"]) / "TRAINING.md" if summary["config"]["init"] else None
    )
    # a continuation: keep the earlier stages' reports
    if previous is not None and previous.is_file():
        text += "\n## Earlier stage (the `init` model)\n\n" + previous.read_text().replace(
            "\n# ", "\n### ", 1
        )
    (out / "TRAINING.md").write_text(text)


def report(summary: dict[str, Any]) -> str:
    """The training report (markdown)."""
    cfg, arch = summary["config"], summary["arch"]
    final = summary["history"][-1]
    started = (f"`{cfg['init']}` (continued training; data seeds offset by {cfg['data_offset']})"
               if cfg["init"] else "a fresh initialization")
    lines = [
        "# Demo model: training report",
        "",
        "Produced by `scripts/training/train_demo_model.py` (fixed seeds; rerun gives the same "
        "model on",
        "the same torch build). Tiny `LlamaForCausalLM` trained from scratch on",
        "`blendrag_demo.corpus` (word-level tokenizer from `scripts/training/demo_tokenizer.py`).",
        "",
        f"- parameters: {summary['params']:,}",
        f"- architecture: {arch['num_hidden_layers']} layers, hidden {arch['hidden_size']}, MLP "
        f"{arch['intermediate_size']},"
        f" {arch['num_attention_heads']} heads / {arch['num_key_value_heads']} KV heads,"
        f" {'tied' if cfg['tie_embeddings'] else 'untied'} embeddings, RoPE theta 10000",
        f"- steps: {cfg['steps']}, batch {cfg['batch_size']} sequences, "
        f"{cfg['questions_per_group']} questions"
        f" per sequence at most (filled up to {cfg['fill_tokens']} tokens past the longest prompt),"
        f" {summary['tokens']:,} tokens seen",
        f"- optimizer: AdamW lr {cfg['lr']} (warmup {cfg['warmup']}, cosine to "
        f"{cfg['min_lr_ratio']}x), weight decay {cfg['weight_decay']}, grad clip 1.0",
        f"- losses: answer+EOS cross-entropy, LM on prompt tokens x{cfg['lm_weight']}, attention"
        f" supervision of {cfg['attn_heads']} last-layer head(s) x{cfg['attn_weight']};"
        f" init: embeddings std {cfg['embed_std']}, copy heads gain {cfg['copy_init']}",
        f"- wall time: {summary['wall_s']:.0f} s on {cfg['threads']} CPU thread(s) "
        f"(`torch.set_num_threads({cfg['threads']})`)",
        f"- started from: {started};"
        f" question kinds drawn with weights {cfg['kind_weights'] or 'the corpus default'}"
        + (
            f"; deepened with layer plan `{cfg['grow']}` (new layers start as identity blocks)"
            if cfg["grow"]
            else ""
        ),
        "",
        f"Held-out accuracy ({cfg['eval_n']} questions, seed `HELDOUT_SEED`, 4-6 passages,",
        "greedy decoding after a full prefill, exact match after normalization):",
        "",
        "| kind | accuracy |",
        "|---|---|",
    ]
    lines += [f"| {k} | {final[k]:.3f} |" for k in (*KINDS, "overall") if k in final]
    lines += [
        "",
        "`model.generate` greedy on the first 100 held-out questions: "
        f"{summary['generate_acc_100']:.3f}.",
        "",
        "Evaluation history:",
        "",
        "| step | time (s) | " + " | ".join(k for k in (*KINDS, "overall")) + " |",
        "|---" * (len(KINDS) + 3) + "|",
    ]
    for h in summary["history"]:
        lines.append(
            f"| {h['step']} | {h['time_s']} | "
            + " | ".join(f"{h.get(k, 0):.3f}" for k in (*KINDS, "overall"))
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = TrainConfig()
    for name, value in asdict(defaults).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="model directory ('-' to not save)")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    train(TrainConfig(**args), None if str(out) == "-" else out)


if __name__ == "__main__":
    main()
