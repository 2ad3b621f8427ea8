"""Attention plans (engine/compute/attention.py): every kernel computes the exact mask, on the CPU,
FlexAttention compiled here too (each case its own compile, ``fresh_flex``); its block mask
marks exactly the key blocks that a tile of queries sees whole, in part or not at all."""

from __future__ import annotations

import pytest
import torch

from blendrag.engine.compute import flex
from blendrag.engine.compute.attention import (
    BlockPlan,
    CausalPlan,
    FlexPlan,
    LastPlan,
    LowerRightPlan,
    PaddedCausalPlan,
    kernel_for,
    plan_attention,
    score_bias,
)
from blendrag.engine.compute.layer import attention_probs

H, HKV, D = 4, 2, 16
SCALE = D**-0.5


def fresh_flex(monkeypatch) -> None:
    """FlexAttention compiled afresh, for this call's shapes only. On the CPU, Inductor builds
    the engine's dynamic-shape FlexAttention for a process's first shapes, but fails to build
    it for sliding windows and for most later shapes (torch 2.13: a C++ compile error), after
    which the engine runs the exact fallback for the rest of the process: without a compile
    of its own, a flex case would test the fallback. The block mask and the mask functions,
    this module's, are the same either way (CUDA compiles them with dynamic shapes: the GPU
    check's exactness phase)."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    monkeypatch.setattr(flex, "_FLEX", [torch.compile(flex_attention, dynamic=False)])


def reference(q, k, v, pos, n, window=None, softcap=None):
    """Attention in float64 with the dense exact mask: key j visible to a query at p iff
    j <= p (and p - j < window). q: [H, A, D]; k, v: [Hkv, >= n, D] -> [H, A, D]."""
    q, k, v = q.double(), k[:, :n].double(), v[:, :n].double()
    k, v = k.repeat_interleave(H // HKV, 0), v.repeat_interleave(H // HKV, 0)
    logits = q @ k.transpose(1, 2) * SCALE  # [H, A, n]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    keys = torch.arange(n)
    visible = keys[None] <= pos[:, None]
    if window is not None:
        visible &= keys[None] > pos[:, None] - window
    return logits.masked_fill(~visible, float("-inf")).softmax(-1) @ v


def positions(kind: str, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if kind == "all":
        return torch.arange(n)
    if kind == "last":
        return torch.tensor([n - 1])
    if kind == "tail":
        return torch.arange(n - 70, n)
    # scattered: a random fifth of the tokens, then a suffix of 9 (what blend computes)
    chosen = torch.randperm(n - 9, generator=g)[: n // 5].sort().values
    return torch.cat([chosen, torch.arange(n - 9, n)])


def tensors(a: int, n: int, extra: int = 8):
    """q for ``a`` queries; k, v of a buffer longer than n whose rows past n are NaN: a plan
    that read a key beyond the prompt would show it."""
    g = torch.Generator().manual_seed(a * 1000 + n)
    q = torch.randn(H, a, D, generator=g)
    k, v = (torch.randn(HKV, n + extra, D, generator=g) for _ in range(2))
    k[:, n:], v[:, n:] = float("nan"), float("nan")
    return q, k, v


@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
@pytest.mark.parametrize("window", [None, 48])
@pytest.mark.parametrize("kind", ["all", "last", "tail", "scattered"])
@pytest.mark.parametrize("n", [300, 129])
def test_every_plan_computes_the_exact_mask(kernel, window, kind, n, monkeypatch):
    pos = positions(kind, n)
    q, k, v = tensors(pos.shape[0], n)
    plan = plan_attention(pos, n, window, kernel)
    if isinstance(plan, FlexPlan):
        fresh_flex(monkeypatch)
        # FlexAttention reads the whole buffer, the rows past the prompt masked (the engine's
        # hold no NaN, engine/compute/fused_kv.py): large finite rows there, which would
        # dominate any query that saw them
        k[:, n:], v[:, n:] = 1e3, 1e3
    out = plan.attend(q, k, v, SCALE)
    if isinstance(plan, FlexPlan):  # FlexAttention computed it, not the fallback
        assert flex._FLEX[0] is not None
    assert (out.double() - reference(q, k, v, pos, n, window)).abs().max() < 2e-6
    ref_keys = sum(min(p + 1, window or n) for p in pos.tolist())
    assert plan.attended_keys == ref_keys


def test_each_shape_of_queries_takes_its_kernel():
    n = 300
    assert isinstance(plan_attention(torch.arange(n), n, None), CausalPlan)
    assert isinstance(plan_attention(torch.tensor([n - 1]), n, None), LastPlan)
    for kind in ("tail", "scattered"):  # the CPU's row blocks
        assert isinstance(plan_attention(positions(kind, n), n, None), BlockPlan)
    assert isinstance(plan_attention(positions("scattered", n), n, None, "flex"), FlexPlan)
    # a window the prompt does not reach is no window
    assert isinstance(plan_attention(torch.arange(n), n, n + 5), CausalPlan)
    assert isinstance(plan_attention(torch.arange(n), n, 48, "flex"), FlexPlan)
    assert kernel_for("auto", torch.device("cpu")) == "sdpa"
    assert kernel_for("auto", torch.device("cuda")) == "flex"
    with pytest.raises(ValueError, match="attention must be one of"):
        kernel_for("triton", torch.device("cpu"))


def test_the_lower_right_causal_bias_is_the_exact_mask_of_contiguous_queries():
    """CUDA's path for contiguous queries (on the CPU torch builds the same mask per call)."""
    n, a = 300, 70
    pos = torch.arange(n - a, n)
    q, k, v = tensors(a, n)
    plan = LowerRightPlan(a, n)
    assert (plan.attend(q, k, v, SCALE).double() - reference(q, k, v, pos, n)).abs().max() < 2e-6
    assert plan.attended_keys == sum(p + 1 for p in pos.tolist())


def test_a_long_tail_runs_as_the_full_prefills_causal_call_with_its_rows_kept():
    """CUDA's path for contiguous queries that are most of the prompt (prefix mode): the
    tail's rows of a causal call over all n rows, bit for bit those a full prefill computes."""
    n, a = 300, 200
    pos = torch.arange(n - a, n)
    q, k, v = tensors(n, n)  # the full prefill's queries; the plan sees their tail
    plan = PaddedCausalPlan(a, n)
    got = plan.attend(q[:, n - a:], k, v, SCALE)
    assert (got.double() - reference(q[:, n - a:], k, v, pos, n)).abs().max() < 2e-6
    full = CausalPlan(n).attend(q, k, v, SCALE)
    assert torch.equal(got, full[:, n - a:])
    again = plan.attend(q[:, n - a:] * 2, k, v, SCALE)  # its padded queries reused, refilled
    assert torch.equal(again, CausalPlan(n).attend(q * 2, k, v, SCALE)[:, n - a:])
    assert plan.attended_keys == sum(p + 1 for p in pos.tolist())


def test_soft_capped_plans_cap_before_the_mask():
    n = 200
    pos = positions("scattered", n)
    q, k, v = tensors(pos.shape[0], n)
    q = q * 4  # logits large enough to reach the cap
    plan = plan_attention(pos, n, 32, softcap=2.0)
    assert isinstance(plan, BlockPlan)
    ref = reference(q, k, v, pos, n, 32, softcap=2.0)
    assert (plan.attend(q, k, v, SCALE).double() - ref).abs().max() < 2e-6


@pytest.mark.parametrize("window", [None, 200])
def test_the_block_mask_marks_whole_partial_and_skipped_key_blocks(window):
    """For each tile of 128 queries: a key block is "full" iff every query of the tile sees all
    its keys, listed (partial) iff some query sees some of them, else skipped."""
    n = 1000
    g = torch.Generator().manual_seed(7)
    pos = torch.cat([torch.randperm(n - 40, generator=g)[:300].sort().values,
                     torch.arange(n - 40, n)])
    mask = FlexPlan(pos, n, window, 0).block_mask(1024)  # a buffer of 1,024 rows
    keys = torch.arange(n)
    visible = keys[None] <= pos[:, None]
    if window is not None:
        visible &= keys[None] > pos[:, None] - window
    kv_num, kv_idx = mask.kv_num_blocks[0, 0], mask.kv_indices[0, 0]
    full_num, full_idx = mask.full_kv_num_blocks[0, 0], mask.full_kv_indices[0, 0]
    b = flex.FLEX_BLOCK
    for t in range(-(-pos.shape[0] // b)):
        rows = visible[t * b:(t + 1) * b]
        full = {j for j in range(-(-n // b)) if rows[:, j * b:(j + 1) * b].all()
                and (j + 1) * b <= n}
        seen = {j for j in range(-(-n // b)) if rows[:, j * b:(j + 1) * b].any()}
        assert set(full_idx[t, :full_num[t]].tolist()) == full
        assert set(kv_idx[t, :kv_num[t]].tolist()) == seen - full
        # the mask is evaluated only across the span of the tile's own positions (and window)
        tile = pos[t * b:(t + 1) * b]
        assert int(kv_num[t]) <= (int(tile[-1]) - int(tile[0]) + (window or 0)) // b + 2


def test_the_score_bias_is_the_exact_mask_repeated_per_query_group():
    n = 60
    pos = torch.arange(n - 7, n)
    bias = score_bias(pos, n, None, groups=2)
    assert bias.shape == (14, n)
    assert torch.equal(bias[:7], bias[7:])
    visible = torch.arange(n)[None] <= pos[:, None]
    assert torch.equal(bias[:7] == 0, visible)
    q, k, _ = tensors(7, n)
    probs = attention_probs(q, k[:, :n], pos, SCALE)
    ref = reference(q, k, torch.eye(n)[None].expand(HKV, n, n), pos, n)  # values = one-hot keys
    assert (probs.double() - ref[:, :, :n]).abs().max() < 2e-6


def _flex_failing_with(monkeypatch, failing):
    """FlexAttention replaced by ``failing``, and a flex plan of scattered queries over 300
    keys: (pos, n, q, k, v, plan)."""

    monkeypatch.setattr(flex, "_FLEX", [failing])
    n = 300
    pos = positions("scattered", n)
    q, k, v = tensors(pos.shape[0], n)
    return pos, n, q, k, v, plan_attention(pos, n, None, "flex")


@pytest.mark.parametrize("error, kept", [(torch.OutOfMemoryError("out of memory"), True),
                                         (RuntimeError("no compiler here"), False)])
def test_flex_is_switched_off_for_a_lasting_failure_not_for_a_lack_of_memory(
        monkeypatch, caplog, error, kept):
    """A kernel that cannot run here (no compiler, an unsupported shape) is not tried again in
    the process; running out of device memory falls back for that call only. Either way the
    call's answer is the exact one."""

    def failing(*args, **kwargs):
        raise error

    pos, n, q, k, v, plan = _flex_failing_with(monkeypatch, failing)
    with caplog.at_level("WARNING", logger="blendrag.engine.compute.attention"):
        out = plan.attend(q, k, v, SCALE)
    assert (out.double() - reference(q, k, v, pos, n)).abs().max() < 2e-6
    assert flex._FLEX == ([failing] if kept else [None])
    # either way said (the GPU check counts these warnings as slower paths taken)
    assert ("out of device memory" if kept else "not usable here") in caplog.text


def test_out_of_memory_leaves_flex_for_the_rest_of_the_pass_only(monkeypatch, caplog):
    """One plan serves every layer of a pass: out of device memory at one layer, the others
    take the row blocks at once (one warning, not one per layer); the next pass tries again."""

    tried = []

    def failing(*args, **kwargs):
        tried.append(1)
        raise torch.OutOfMemoryError("out of memory")

    pos, n, q, k, v, plan = _flex_failing_with(monkeypatch, failing)
    with caplog.at_level("WARNING", logger="blendrag.engine.compute.attention"):
        for _ in range(3):  # three layers
            out = plan.attend(q, k, v, SCALE)
            assert (out.double() - reference(q, k, v, pos, n)).abs().max() < 2e-6
    assert len(tried) == 1 and caplog.text.count("out of device memory") == 1
    plan_attention(pos, n, None, "flex").attend(q, k, v, SCALE)  # the next pass
    assert len(tried) == 2
