"""GPU work of a capture as flat arrays: kernels, memcpys and memsets, each linked to the CPU call that launched it.

Every reader (an Nsight Systems export, a torch-profiler trace) produces these arrays; nothing downstream knows
which reader ran. A GPU activity links to its launch through (process, correlationId). Graph replays are one launch
(`cudaGraphLaunch`) whose nodes all share its correlationId.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# Op kinds
KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2

COPY_KINDS = {0: "unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}


@dataclass
class Ops:
    """One row per GPU activity, as parallel arrays, kept narrow (millions of rows).

    `name_id` / `demangled_id` (int32) are string ids of the reader (`strings()`) for kernels; for memory ops they
    are negative codes (-1 - copyKind for memcpy, -100 for memset). `launch_key` is process bits << 32 |
    correlationId. `launch_tid` / `launch_ns` are the launching thread and the start of the launch call (-1 when no
    launch call was recorded; `launched` tells them apart from a real launch at a negative time). `device` is the
    GPU id (int32: any id the capture names).
    """

    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    device: np.ndarray  # int32
    launch_key: np.ndarray  # int64
    name_id: np.ndarray  # int32
    demangled_id: np.ndarray  # int32
    graph_node: np.ndarray  # int64, -1 outside graphs
    stream: np.ndarray  # int32
    kind: np.ndarray  # int8
    launch_tid: np.ndarray  # int64
    launch_ns: np.ndarray  # int64
    launched: np.ndarray | None = None  # bool: a launch call was found (None: launch_ns >= 0 says it)
    grid: np.ndarray | None = None  # int64 launch grid, pack_grid (-1: not recorded, or a memory op)
    block: np.ndarray | None = None  # int64 block and registers per thread, pack_block (-1: not recorded)

    def __post_init__(self):
        if self.launched is None:
            self.launched = self.launch_ns >= 0
        if self.grid is None:
            self.grid = np.full(len(self.start), -1, dtype=np.int64)
        if self.block is None:
            self.block = np.full(len(self.start), -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def correlation(self) -> np.ndarray:
        return self.launch_key & LOW32

    @property
    def pid(self) -> np.ndarray:
        """VM and process bits of the globalPid (globalPid >> 24)."""
        return self.launch_key >> 32

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end - self.start

    def take(self, index) -> "Ops":
        return Ops(**{k: v[index] for k, v in self.__dict__.items()})


LOW32 = np.int64(0xFFFFFFFF)

# A kernel's launch shape in two integers (the same packing as queries/gpu_kernels.sql):
#   grid  = gridX << 32 | gridY << 16 | gridZ                        (gridX < 2^31, gridY and gridZ < 2^16)
#   block = blockX << 48 | blockY << 32 | blockZ << 16 | registers   (each < 2^15)
# -1 when a value is missing or does not fit (never a wrapped, wrong shape).
GRID_X_MAX, GRID_YZ_MAX, BLOCK_MAX = (1 << 31) - 1, (1 << 16) - 1, (1 << 15) - 1


def pack_grid(x, y, z) -> np.ndarray:
    x, y, z = (np.asarray(v, dtype=np.int64) for v in (x, y, z))
    fits = (x >= 0) & (x <= GRID_X_MAX) & (y >= 0) & (y <= GRID_YZ_MAX) & (z >= 0) & (z <= GRID_YZ_MAX)
    return np.where(fits, (x << 32) | (y << 16) | z, -1)


def pack_block(x, y, z, registers) -> np.ndarray:
    vals = [np.asarray(v, dtype=np.int64) for v in (x, y, z, registers)]
    fits = np.logical_and.reduce([(v >= 0) & (v <= BLOCK_MAX) for v in vals])
    x, y, z, r = vals
    return np.where(fits, (x << 48) | (y << 32) | (z << 16) | r, -1)


def unpack_shape(grid: int, block: int) -> dict | None:
    """{"grid": [x, y, z], "block": [x, y, z], "registers_per_thread": r} of packed values; None when unknown."""
    grid, block = int(grid), int(block)
    if grid < 0 or block < 0:
        return None
    return {"grid": [grid >> 32, (grid >> 16) & 0xFFFF, grid & 0xFFFF],
            "block": [block >> 48, (block >> 32) & 0xFFFF, (block >> 16) & 0xFFFF],
            "registers_per_thread": block & 0xFFFF}


def shape_label(shape: dict | None) -> str:
    """A launch shape as people read it: `grid 2x66x1 block 384 regs 168` (block 128x2 when 2-D)."""
    if shape is None:
        return "shape not recorded"
    block = shape["block"]
    b = "x".join(str(v) for v in (block if block[2] != 1 else block[:2] if block[1] != 1 else block[:1]))
    text = f"grid {'x'.join(str(v) for v in shape['grid'])} block {b} regs {shape['registers_per_thread']}"
    gemm = shape.get("gemm")
    if not gemm:
        return text
    return text + (f" M={gemm['m']}" if gemm.get("m") else "") + f" N={gemm['n']} K={gemm['k']}"


def memop_name(code: int) -> str:
    """Display name of a memory op's negative name code."""
    if code == -100:
        return "[CUDA memset]"
    return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, str(-1 - code))}]"
