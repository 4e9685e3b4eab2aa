"""The one reader interface every capture offers, whatever its format: an Nsight Systems export (reader.py Export),
its op store (cache.py StoreSource), torch-profiler traces (kineto.py KinetoTrace) and the ranks of one run side by
side (attribute/many.py MergedSource). Everything above trace/ reads a capture through these members only, so
nothing there asks which reader it holds; a member a format cannot fill answers None (documented per member), not
an AttributeError.

tests/test_reader_protocol.py checks that each reader defines every member itself (no attribute forwarding) and
that a real capture of each kind answers them with the documented types.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional, Protocol, runtime_checkable

import numpy as np

from profattr.trace.nsys_sqlite import NsysTables
from profattr.trace.ops import Ops


@runtime_checkable
class Reader(Protocol):
    """A capture open for reading. Time is in ns on the capture's clock; string ids index `strings()`."""

    path: object  # the capture (a Path; "A + B" for merged ranks)
    format: str  # "nsys" or "torch": which profiler recorded it (what its clock and records mean)
    nsys_version: Optional[str]  # None for torch traces
    schema_version: Optional[str]  # the export's schema version; None for torch traces
    gpus: list  # one dict per GPU the capture describes (id, name, memory, bandwidth, ...)
    claims: object  # validate.Claims: what the arrays were checked for, and the damaged rows skipped

    @property
    def tool_version(self) -> Optional[str]:
        """The profiler's version as recorded (nsys's; torch traces: None)."""

    def ops(self, include_memory: bool = True) -> Ops:
        """Every GPU op (kernels, and memcpy/memset unless `include_memory` is False), checked."""

    def time_windows(self, size: Optional[int] = None) -> Optional[Iterator[Ops]]:
        """The ops a window at a time in start order (an op store), or None when the reader holds them at once."""

    def ranges(self):
        """NVTX ranges (DataFrame: start, end, tid, text, domain)."""

    def graph_launches(self) -> Optional[dict]:
        """cudaGraphLaunch calls (arrays start, end, tid, correlation, key); None when the capture has none."""

    def node_creation(self) -> Optional[dict]:
        """CUDA-graph node creation events (arrays node, original, tid, start); None when not recorded."""

    def strings(self, ids: Iterable[int]) -> dict:
        """{id: text} for the string ids asked (ids not known are left out)."""

    def api_calls(self) -> dict:
        """CUDA calls that launch, copy or wait: arrays tid, start, end, kind (0 graph, 1 kernel, 2 memory, 3 sync)."""

    def host_calls(self):
        """api_calls() in start order as a trace/calls.py ApiCalls (blocks(), between(lo, hi), counts), read once;
        for a long capture held a few blocks at a time."""

    def fold_api_keys(self, start):
        """`start()`, an accumulator, given (`.add(keys)`) the keys process << 32 | correlationId of every recorded
        CUDA call a block at a time, in any order; returns it."""

    def record_span(self) -> tuple:
        """(first start, last end) of the CPU-side records; (None, None) without any."""

    def kernel_configs(self) -> dict:
        """Every kernel's device, name id, grid, block, start and duration (arrays)."""

    def cpu_samples(self) -> Optional[dict]:
        """CPU samples (arrays tid, start, leaf_symbol, leaf_module, py_symbol, py_module); None without any."""

    def sampling_period_ns(self) -> Optional[float]:
        """The CPU sampling period; None when the capture records none."""

    def torch_ops(self):
        """The torch operators (DataFrame: start, end, tid, text); None when the format records none (nsys)."""

    def python_frames(self):
        """Python frames (DataFrame: start, end, tid, text); None when the format records none (nsys)."""

    def nsys_tables(self) -> Optional[NsysTables]:
        """The export's SQL tables, for the nsys-only questions (diagnostics, driver version, NVTX event types,
        CUDA-graph launch SQL); None for torch traces and merged ranks."""

    def launch_gpu_starts(self) -> Optional[dict]:
        """Every CUDA-graph launch call with the first GPU work it launched (arrays start, end, tid, gpu_start,
        device: trace/nsys_graphs.py); None without graph launches or where the format does not link them."""

    def gpu_interval_windows(self):
        """Arrays start, end, device of every GPU activity, in parts (windows of rows) that together hold each
        once; none where the format has no such table."""

    def close(self) -> None:
        """Let go of what the reader holds (files, temporary stores)."""


def is_reader(value) -> bool:
    """Whether `value` is an open reader (rather than a path or a list of paths)."""
    return isinstance(value, Reader)


class KeyBlocks:
    """An accumulator for fold_api_keys that keeps the blocks as they come (`blocks`)."""

    def __init__(self):
        self.blocks: list = []

    def add(self, keys) -> None:
        self.blocks.append(np.asarray(keys, dtype=np.int64))
