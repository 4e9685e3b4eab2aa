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

    def __post_init__(self):
        if self.launched is None:
            self.launched = self.launch_ns >= 0

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


def memop_name(code: int) -> str:
    """Display name of a memory op's negative name code."""
    if code == -100:
        return "[CUDA memset]"
    return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, str(-1 - code))}]"
