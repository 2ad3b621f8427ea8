"""Where one request's time goes on the device, per mode, at the 3k prompt: ``torch.profiler``
of one warm request of each mode; the top ops by device time, the kernel launches and the host
syncs counted (a request of this size is bound by them on a GPU); on a GPU, the top ops by
the host's time as well. The default runs first (the phase has a cap, and the default's time
at 3k is the one its parts do not explain: on an H200 its phases summed to 64 ms and its
requests took 90-95), with its timeline (the host's long events and the device's bursts of
kernels, in time order) and the host's time per function (``cProfile``: what the host waits
in, queues and threads included). Each mode's host syncs are named by where the package makes
them (``sync_sites``): on a GPU every call that waits for the device."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial

import torch
from torch.autograd import DeviceType
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import blendrag
from blendrag.config import BlendConfig
from blendrag_bench.gpu.shapes import sync, workload
from blendrag_bench.gpu.summary import Headlines
from blendrag_bench.ttft import build_engine, random_layout

MODES = (BlendConfig(), BlendConfig(mode="reuse"), BlendConfig(selector="epic", ratio=0.15),
         BlendConfig(mode="full"), BlendConfig(mode="prefix"))
HOST_FUNCTIONS = 30  # rows of the default's host profile
HOST_MS, GAP_MS = 0.3, 1.0  # the default's timeline: host events shown, device gaps
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "aten::_local_scalar_dense")


def run(emit: Callable[[str], None], small: bool, out: Headlines | None = None) -> Headlines:
    """Each mode's profile; ``out`` takes its launches and syncs as they are counted."""
    w = workload(small, "3k")
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    out = {} if out is None else out
    for config in MODES:
        for _ in range(2):
            engine.prefill(layout, config)
        sync()
        with profile(activities=activities) as prof:
            engine.prefill(layout, config)
            sync()
        events = prof.key_averages()
        launches = sum(e.count for e in events if e.key in LAUNCHES)
        syncs = sum(e.count for e in events if e.key in SYNCS)
        emit(f"\n### {config.label}: {layout.num_tokens} tokens, {launches} kernel launches, "
             f"{syncs} host syncs")
        emit(events.table(sort_by=key, row_limit=16, max_name_column_width=60))
        if cuda:  # a request of this size is bound by the host: where its time goes there
            emit(events.table(sort_by="self_cpu_time_total", row_limit=12,
                              max_name_column_width=60))
        emit(sync_sites(partial(engine.prefill, layout, config), cuda))
        if config == BlendConfig():
            emit(timeline(prof.events()))
            emit(host_profile(partial(engine.prefill, layout, config)))
        out[f"{config.label} kernel launches"] = (float(launches), "", None)
        out[f"{config.label} host syncs"] = (float(syncs), "", None)
    return out


# what waits for the device on a GPU, seen on any device: reads of a tensor's values, and
# tensors made from the host's data (on CUDA a blocking copy: it waits for the stream's work)
HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
              "__index__", "nonzero", "tensor"}
# a site is the package's frames nearest the call (the bench's own and torch's excluded)
PACKAGE = os.path.dirname(blendrag.__file__) + os.sep
SYNC_WARNING = "synchroniz"  # torch's: "called a synchronizing CUDA operation"


def _site(stack: list[traceback.FrameSummary]) -> str:
    """The package's three innermost frames of ``stack`` (innermost first; "": none, a call
    of the bench's own)."""
    own = [f for f in stack if f.filename.startswith(PACKAGE)][::-1][:3]
    return " < ".join(f"blendrag/{f.filename[len(PACKAGE):]}:{f.lineno}" for f in own)


class _HostReads(TorchFunctionMode):
    """The sites of the package's calls in ``HOST_READS`` (what a CPU run can see)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS and not (name == "tensor" and args and isinstance(args[0],
                                                                   torch.Tensor)):
            site = _site(traceback.extract_stack()[:-1])
            if site:
                self.sites[f"{name} @ {site}"] += 1
        return func(*args, **(kwargs or {}))


def sync_sites(request: Callable[[], object], cuda: bool) -> str:
    """One ``request``'s host syncs by site: on CUDA each call that synchronizes with the
    device (``torch.cuda.set_sync_debug_mode``: item, nonzero, a blocking copy either way),
    elsewhere the calls that would (``HOST_READS``)."""
    if not cuda:
        reads = _HostReads()
        with reads:
            request()
        return _sites_text("host reads (each a sync on a GPU)", reads.sites)
    sites: Counter[str] = Counter()
    shown = warnings.showwarning

    def seen(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):  # another warning: shown as it would be
            shown(message, category, filename, lineno, file, line)
            return
        site = _site(traceback.extract_stack()[:-1])
        if site:
            sites[site] += 1

    mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            request()
        finally:
            torch.cuda.set_sync_debug_mode(mode)
    return _sites_text("host syncs (torch.cuda.set_sync_debug_mode)", sites)


def _sites_text(title: str, sites: Counter[str]) -> str:
    lines = [f"{title}: {sum(sites.values())}, by site (innermost frame first)"]
    lines += [f"  {n:4d}  {site}" for site, n in sites.most_common()]
    return "\n".join(lines)


def host_profile(request: Callable[[], object]) -> str:
    """One ``request`` under ``cProfile``: the functions by cumulative host time, the engine's,
    the waits (queues, threads, locks) and torch's Python-side calls among them."""
    profiler = cProfile.Profile()
    profiler.enable()
    request()
    sync()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
    stats.print_stats("blendrag|threading|queue|torch|cuda", HOST_FUNCTIONS)
    return "host time per function (cProfile, one request):\n" + text.getvalue()


def timeline(events) -> str:
    """One profiled request in time order: the host's top-level events of ``HOST_MS`` or more
    (what it waited in, and when), and on a GPU the device's bursts of kernels with the idle
    gaps between them (a gap of ``GAP_MS`` or more ends a burst): where neither side works."""
    host = sorted((e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None),
                  key=lambda e: e.time_range.start)
    if not host:
        return "timeline: no host events"
    t0 = host[0].time_range.start
    lines = [f"timeline (ms from the request's start): host events of {HOST_MS} ms or more"]
    lines += [f"  {(e.time_range.start - t0) / 1e3:8.2f} +{e.time_range.elapsed_us() / 1e3:7.2f}"
              f"  {e.name[:70]}" for e in host if e.time_range.elapsed_us() >= HOST_MS * 1e3]
    kernels = sorted((e for e in events if e.device_type == DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if kernels:
        lines.append(f"device: bursts of kernels, a gap of {GAP_MS} ms or more between two "
                     "(start, end, kernels, busy ms)")
        burst: list = []
        for k in kernels + [None]:
            if burst and (k is None or k.time_range.start - burst[-1].time_range.end
                          >= GAP_MS * 1e3):
                start, end = burst[0].time_range.start, max(b.time_range.end for b in burst)
                busy = sum(b.time_range.elapsed_us() for b in burst)
                lines.append(f"  {(start - t0) / 1e3:8.2f} .. {(end - t0) / 1e3:8.2f}"
                             f"  {len(burst):5d}  {busy / 1e3:7.2f}")
                burst = []
            if k is not None:
                burst.append(k)
    return "\n".join(lines)
