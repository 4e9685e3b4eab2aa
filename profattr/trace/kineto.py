"""Torch-profiler (Kineto) traces, Chrome trace JSON (`.json` or `.json.gz`; several rank files, or a folder of
them, are one capture), read into the same arrays as an Nsight Systems export.

What a trace holds (torch 2.x, CUPTI activities), and how it maps:
- events `ph: "X"` with `cat` kernel / gpu_memcpy / gpu_memset: GPU ops on `args.device` and `args.stream`, linked to
  their launch through `args.correlation` (the CUPTI correlation id; the `ac2g` flow events say the same);
- `cat` cuda_runtime / cuda_driver: CUDA API calls on (pid, tid) with `args.correlation`; a `cudaGraphLaunch`
  call's correlation is shared by every kernel the graph replays (their node ids are not recorded: profattr numbers
  the kernels of each replay in GPU start order);
- `cat` user_annotation: CPU-side ranges (`record_function`, SGLang's `step[DECODE bs=N]` spans, `ProfilerStep#N`),
  the ranges of the NVTX projection;
- `cat` cpu_op: the torch operators (`aten::mm`, `sgl_kernel::moe_align_block_size`, `vllm::...`) on (pid, tid); the
  innermost one around a kernel's launch call is the op that launched it (`torch_ops`, the launch context);
- `cat` python_function (traces recorded with_stack): the Python frames on (pid, tid), `file.py(line): function`;
  the frames around a launch are its Python stack (`python_frames`);
- top level: `deviceProperties` (GPUs), `distributedInfo` (rank, world size), `baseTimeNanoseconds`, versions.
Times: `ts` and `dur` are microseconds; ns = round(us * 1000). Ranks are told apart by file: file k's processes and
threads get k in their high bits; the ranks of one run share the host clock, so their times line up.
Events without the fields their kind needs (or with values no capture holds: ids beyond 31 bits, times beyond 64)
are skipped and counted (`skipped`); the arrays are then checked as every reader's are (trace/validate.py).
"""
from __future__ import annotations

import gzip
import re
import zlib
from array import array
from pathlib import Path

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr import inputs
from profattr.errors import ProfattrError
from profattr.trace.jsonstream import JSONStreamError, members
from profattr.trace.ops import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Ops, pack_block, pack_grid
from profattr.trace.validate import INT31, TORCH_NAMES, Claims
from profattr.text import qualified_name

GPU_CATS = {"kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "gpu_memset": KIND_MEMSET}
API_CATS = ("cuda_runtime", "cuda_driver")
RANGE_CATS = ("user_annotation",)
OP_CATS = ("cpu_op",)
FRAME_CATS = ("python_function",)
# "Memcpy HtoD (Pinned -> Device)" -> ENUM_CUDA_MEMCPY_OPER codes, as in nsys exports
COPY_CODES = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9,
              "PtoP": 10}
COPY_KIND = re.compile(r"Memcpy (\w+)")
API_KIND = [(re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)"), 0), (re.compile(r"^(cudaLaunch|cuLaunch)\w*Kernel"), 1),
            (re.compile(r"^(cudaMemcpy|cudaMemset|cuMemcpy|cuMemset)"), 2), (re.compile(r"Synchronize"), 3)]
FILE_SHIFT = 40  # thread ids: file index << 40 | tid
TRACE_SUFFIXES = (".json", ".json.gz")
MAX_FILES = 1024


def short_name(demangled: str) -> str:
    """The function's own name, as nsys's shortName gives it: no return type, namespaces, templates, arguments."""
    return qualified_name(demangled).rsplit("::", 1)[-1] or demangled


def trace_files(path: Path) -> list:
    """The trace files of a capture path: the file itself, or a folder's *.json / *.json.gz files."""
    if inputs.file_or_folder(path, "a torch-profiler trace or a folder of them") == "folder":
        try:
            # regular files only (is_file follows links and says no for FIFOs, sockets and devices)
            files = sorted(p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.is_file())
        except OSError as exc:
            raise ProfattrError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
        if not files:
            raise ProfattrError(f"{path}: a folder with no torch-profiler traces (*.json, *.json.gz) in it")
        if len(files) > MAX_FILES:
            raise ProfattrError(f"{path}: {len(files)} trace files; give at most {MAX_FILES} ranks")
        for f in files:
            inputs.remember(f)
        return files
    return [path]


class _Columns:
    """Typed, growing columns (array('q') per field): a few bytes per event, no Python objects kept."""

    def __init__(self, names):
        self.cols = {n: array("q") for n in names}

    def add(self, *values):
        """One row; all of it or, when a value does not fit 64 bits (OverflowError), none of it."""
        row = [int(v) for v in values]
        if any(not -(1 << 63) <= v < (1 << 63) for v in row):
            raise OverflowError("a value beyond 64 bits")
        for col, v in zip(self.cols.values(), row):
            col.append(v)

    def arrays(self) -> dict:
        return {n: np.frombuffer(c, dtype=np.int64).copy() if len(c) else np.zeros(0, dtype=np.int64)
                for n, c in self.cols.items()}


class KinetoTrace:
    """The reader interface of profattr (see trace/reader.py Export) over one or several torch-profiler traces."""

    format = "torch"
    nsys_version = None

    def __init__(self, path):
        if isinstance(path, (list, tuple)):  # the rank files of one capture
            self.files = [Path(p) for p in path]
            self.path = self.files[0].parent if len(self.files) > 1 else self.files[0]
        else:
            self.path = Path(path)
            self.files = trace_files(self.path)
        self.names: dict = {}
        self._by_id: dict | None = None  # id -> name, built when first asked (after every file is read)
        self._short: dict = {}
        self._gpu = _Columns(["start", "end", "device", "stream", "key", "name", "kind", "gx", "gy", "gz",
                              "bx", "by", "bz", "regs"])
        self._api = _Columns(["tid", "start", "end", "key", "name"])
        self._ranges = _Columns(["tid", "start", "end", "name"])
        self._torch_ops = _Columns(["tid", "start", "end", "name"])
        self._frames = _Columns(["tid", "start", "end", "name"])
        self.skipped: dict = {}
        self.gpus: list = []
        self.ranks: list = []
        self.meta: dict = {}
        for index, f in enumerate(self.files):
            self._read(index, f)
        self._check_ranks()
        if not len(self._gpu.cols["start"]):
            damaged = sum(n for why, n in self.skipped.items() if why.split()[0] in GPU_CATS)
            if damaged:
                raise ProfattrError(f"{self.path}: every one of its {damaged} GPU events lacks the fields a GPU op "
                                    "needs (ts, dur, args.device, args.correlation as numbers): the trace is "
                                    "damaged; copy it again, or profile again")
            raise ProfattrError(f"{self.path}: a torch-profiler trace without GPU events: it was profiled without "
                                "GPU activity; capture with activities CPU and GPU (SGLang: /start_profile "
                                "{\"activities\": [\"CPU\", \"GPU\"]}, or `profattr capture --profiler torch`; "
                                "torch.profiler: ProfilerActivity.CUDA)")
        self.schema_version = str(self.meta.get("schemaVersion")) if "schemaVersion" in self.meta else None
        self.tool_version = (f"torch profiler trace schema {self.schema_version}, CUPTI "
                             f"{self.meta.get('cupti_version')}, CUDA runtime {self.meta.get('cuda_runtime_version')}")
        self._gpu_arrays = self._unique(self._gpu.arrays(), "GPU events")
        self._api_arrays = self._unique(self._api.arrays(), "CUDA API events")
        self._range_arrays = self._unique(self._ranges.arrays(), "user_annotation events")
        self._op_arrays = self._torch_ops.arrays()
        self._frame_arrays = self._frames.arrays()
        del self._gpu, self._api, self._ranges, self._torch_ops, self._frames
        self.claims = Claims(self.path, None, names=TORCH_NAMES, skipped={
            "trace events": {**self.skipped, "rows": sum(self.skipped.values())}} if self.skipped else None)
        self.claims.window(self._gpu_arrays["start"])  # the time range, from the GPU work, before anything asks

    # --- reading ------------------------------------------------------------------------------------------------
    def _intern(self, name: str) -> int:
        i = self.names.get(name)
        if i is None:
            i = self.names[name] = len(self.names)
        return i

    def _unique(self, arrays: dict, what: str) -> dict:
        """`arrays` without exact repeats of an event (every field equal: the same op written twice, as a trace
        concatenated with itself has it), which would count its time twice; the repeats are counted as skipped."""
        n = len(arrays["start"])
        if n < 2:
            return arrays
        table = np.ascontiguousarray(np.stack(list(arrays.values()), axis=1))
        rows = table.view(np.dtype((np.void, table.dtype.itemsize * table.shape[1]))).reshape(-1)
        _, first = np.unique(rows, return_index=True)
        if len(first) == n:
            return arrays
        self.skipped[f"{what} repeated exactly (the same event twice)"] = n - len(first)
        keep = np.sort(first)
        return {k: v[keep] for k, v in arrays.items()}

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def _read(self, index: int, path: Path) -> None:
        inputs.regular_file(path, "a torch-profiler trace (*.trace.json.gz)")
        try:
            with path.open("rb") as probe:
                head = probe.read(2)
            if not head:
                raise ProfattrError(f"{path}: the file is empty, not a torch-profiler trace; copy the trace again "
                                    "(SGLang writes it when the profiled window closes)")
            opener = gzip.open if head == b"\x1f\x8b" else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
                seen_events = False
                for key, value in members(fh, stream="traceEvents"):
                    if key == "traceEvents":
                        seen_events = True
                        self._events(index, value)
                    elif key in ("deviceProperties", "distributedInfo") or not isinstance(value, (dict, list)):
                        if key == "deviceProperties" and isinstance(value, list):
                            self._devices(value)
                        elif key == "distributedInfo" and isinstance(value, dict):
                            self.ranks.append((path.name, value))
                        elif index == 0:
                            self.meta[key] = value
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ProfattrError(f"{path}: a truncated or damaged gzip file ({exc}); copy the trace again") from None
        except JSONStreamError as exc:
            raise ProfattrError(f"{path}: not a readable trace: {exc}; give a torch-profiler trace (Chrome trace "
                                "JSON, .json or .json.gz), copied again whole") from None
        except RecursionError:
            raise ProfattrError(f"{path}: not a readable trace: JSON nested too deeply") from None
        except OSError as exc:
            raise ProfattrError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if not seen_events:
            raise ProfattrError(f"{path}: JSON, but not a Chrome trace (no traceEvents): give a torch-profiler "
                                "trace (*.trace.json.gz) or an Nsight Systems export")

    def _devices(self, props: list) -> None:
        known = {g["id"] for g in self.gpus}
        for p in props:
            if isinstance(p, dict) and isinstance(p.get("id"), int) and p["id"] not in known:
                self.gpus.append({"id": p["id"], "name": p.get("name"), "computeMajor": p.get("computeMajor"),
                                  "computeMinor": p.get("computeMinor"), "smCount": p.get("numSms"),
                                  "totalMemory": p.get("totalGlobalMem")})
                known.add(p["id"])

    def _events(self, index: int, events) -> None:
        high = index << FILE_SHIFT
        key_high = index << 32
        gpu_add, api_add, range_add, op_add = self._gpu.add, self._api.add, self._ranges.add, self._torch_ops.add
        frame_add = self._frames.add
        intern, skip = self._intern, self._skip
        for ev in events:
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            try:
                if cat in GPU_CATS:
                    args = ev["args"]
                    start = round(float(ev["ts"]) * 1000)
                    kind = GPU_CATS[cat]
                    name = str(ev.get("name", ""))
                    if kind == KIND_KERNEL:
                        code = intern(name)
                        grid, block = args.get("grid") or (0, 0, 0), args.get("block") or (0, 0, 0)
                        regs = args.get("registers per thread", -1)
                    else:
                        m = COPY_KIND.match(name)
                        code = -1 - COPY_CODES.get(m.group(1), 0) if kind == KIND_MEMCPY and m else (
                            -100 if kind == KIND_MEMSET else -1)
                        grid = block = (0, 0, 0)
                        regs = -1
                    device, stream = int(args["device"]), int(args.get("stream", ev.get("tid", 0)))
                    if not (0 <= device <= INT31 and -INT31 <= stream <= INT31):
                        raise ValueError("a device or stream id beyond 31 bits")
                    gpu_add(start, start + round(float(ev["dur"]) * 1000), device, stream,
                            key_high | (int(args["correlation"]) & 0xFFFFFFFF),
                            code, kind, *(int(x) for x in grid[:3]), *(int(x) for x in block[:3]), int(regs))
                elif cat in API_CATS:
                    start = round(float(ev["ts"]) * 1000)
                    api_add(high | int(ev["tid"]), start, start + round(float(ev["dur"]) * 1000),
                            key_high | (int(ev["args"]["correlation"]) & 0xFFFFFFFF), intern(str(ev["name"])))
                elif cat in RANGE_CATS:
                    start = round(float(ev["ts"]) * 1000)
                    range_add(high | int(ev["tid"]), start, start + round(float(ev["dur"]) * 1000),
                              intern(str(ev["name"])))
                elif cat in OP_CATS:
                    start = round(float(ev["ts"]) * 1000)
                    op_add(high | int(ev["tid"]), start, start + round(float(ev["dur"]) * 1000),
                           intern(str(ev["name"])))
                elif cat in FRAME_CATS:
                    start = round(float(ev["ts"]) * 1000)
                    frame_add(high | int(ev["tid"]), start, start + round(float(ev["dur"]) * 1000),
                              intern(str(ev["name"])))
            except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError):
                skip(f"{cat} events without the fields they need")

    def _check_ranks(self) -> None:
        """Several files must be the ranks of one run: distinct ranks of one world size."""
        if len(self.files) < 2:
            return
        infos = [info for _, info in self.ranks]
        if len(infos) != len(self.files):
            return  # ranks not recorded in every file: nothing to compare
        sizes = {repr(info.get("world_size")) for info in infos}  # repr: JSON values need not be hashable
        ranks = [repr(info.get("rank")) for info in infos]
        if len(sizes) != 1 or len(set(ranks)) != len(ranks):
            listed = ", ".join(f"{name}: rank {info.get('rank')} of {info.get('world_size')}" for name, info in self.ranks)
            raise ProfattrError(f"{self.path}: these traces are not the ranks of one run ({listed}); give the rank "
                                "files of one capture")

    # --- the reader interface -------------------------------------------------------------------------------------
    def strings(self, ids) -> dict:
        by_id = self._by_id
        if by_id is None:
            by_id = self._by_id = {i: n for n, i in self.names.items()}
        return {int(i): by_id[int(i)] for i in ids if i is not None and int(i) in by_id}

    def _short_id(self, name_id: int) -> int:
        self.strings(())
        if name_id not in self._short:
            self._short[name_id] = self._intern(short_name(self._by_id[name_id]))
            self._by_id[self._short[name_id]] = short_name(self._by_id[name_id])
        return self._short[name_id]

    def ops(self, include_memory: bool = True) -> Ops:
        g = self._gpu_arrays
        sel = slice(None) if include_memory else g["kind"] == KIND_KERNEL
        start, end, key = g["start"][sel], g["end"][sel], g["key"][sel]
        demangled = g["name"][sel].astype(np.int32)
        uniq, inverse = np.unique(demangled, return_inverse=True)
        short = np.array([self._short_id(int(d)) if d >= 0 else int(d) for d in uniq], dtype=np.int32)[inverse]
        a = self._api_arrays
        order = np.argsort(a["key"], kind="stable")
        keys = a["key"][order]
        pos = np.minimum(np.searchsorted(keys, key), max(len(keys) - 1, 0))
        found = (keys[pos] == key) if len(keys) else np.zeros(len(key), dtype=bool)
        hit = order[pos[found]]
        tid = np.full(len(key), -1, dtype=np.int64)
        ns = np.full(len(key), -1, dtype=np.int64)
        tid[found], ns[found] = a["tid"][hit], a["start"][hit]
        is_kernel = g["kind"][sel] == KIND_KERNEL
        grid = np.where(is_kernel, pack_grid(g["gx"][sel], g["gy"][sel], g["gz"][sel]), -1)
        block = np.where(is_kernel, pack_block(g["bx"][sel], g["by"][sel], g["bz"][sel], g["regs"][sel]), -1)
        graph_node = np.full(len(key), -1, dtype=np.int64)
        launches = self.graph_launches()
        if launches is not None:
            in_replay = np.isin(key, launches["key"])
            idx = np.flatnonzero(in_replay)
            idx = idx[np.lexsort((start[idx], key[idx]))]
            first = np.r_[True, key[idx][1:] != key[idx][:-1]]
            group_start = np.maximum.accumulate(np.where(first, np.arange(len(idx)), 0))
            graph_node[idx] = np.arange(len(idx)) - group_start  # the node's place in its replay
        return self.claims.ops(Ops(start=start, end=end, device=g["device"][sel].astype(np.int32), launch_key=key,
                                   name_id=short, demangled_id=demangled, graph_node=graph_node,
                                   stream=g["stream"][sel].astype(np.int32), kind=g["kind"][sel].astype(np.int8),
                                   launch_tid=tid, launch_ns=ns, launched=found, grid=grid, block=block))

    def ranges(self) -> pd.DataFrame:
        r = self._range_arrays
        names = self.strings(unique(r["name"]))
        return self.claims.ranges(pd.DataFrame({"start": r["start"], "end": r["end"], "tid": r["tid"],
                                                "text": pd.Series([names[int(i)] for i in r["name"]], dtype=object),
                                                "domain": ""}))

    def torch_ops(self) -> pd.DataFrame:
        """The torch operators (cpu_op events) as start, end, tid, text; empty when the trace recorded none."""
        r = self._op_arrays
        names = self.strings(unique(r["name"]))
        return pd.DataFrame({"start": r["start"], "end": r["end"], "tid": r["tid"],
                             "text": pd.Series([names[int(i)] for i in r["name"]], dtype=object)})

    def python_frames(self) -> pd.DataFrame:
        """The Python frames (python_function events) as start, end, tid, text; empty without with_stack."""
        r = self._frame_arrays
        names = self.strings(unique(r["name"]))
        return pd.DataFrame({"start": r["start"], "end": r["end"], "tid": r["tid"],
                             "text": pd.Series([names[int(i)] for i in r["name"]], dtype=object)})

    def _api_kinds(self) -> np.ndarray:
        a = self._api_arrays
        codes = np.full(len(self.names), -1, dtype=np.int64)
        for name, i in self.names.items():
            for pattern, kind in API_KIND:
                if pattern.search(name):
                    codes[i] = kind
                    break
        return codes[a["name"]] if len(a["name"]) else np.zeros(0, dtype=np.int64)

    def graph_launches(self) -> dict | None:
        a = self._api_arrays
        kinds = self._api_kinds()
        sel = kinds == 0
        if not sel.any():
            return None
        order = np.lexsort((a["start"][sel], a["tid"][sel]))
        return self.claims.events({"start": a["start"][sel][order], "end": a["end"][sel][order],
                                   "tid": a["tid"][sel][order], "correlation": (a["key"][sel] & 0xFFFFFFFF)[order],
                                   "key": a["key"][sel][order]}, "graph_launches")

    def node_creation(self):
        return None  # torch traces do not record CUDA-graph node creation

    def time_windows(self, size: int | None = None):
        return None  # the trace is read whole (its JSON streamed into columns)

    def nsys_tables(self):
        return None  # no SQL tables: not an nsys export

    def launch_gpu_starts(self):
        return None  # graph launch costs are read from nsys exports only

    def gpu_interval_windows(self):
        return iter(())

    def record_span(self) -> tuple:
        starts = [a["start"].min() for a in (self._api_arrays, self._range_arrays) if len(a["start"])]
        ends = [a["end"].max() for a in (self._api_arrays, self._range_arrays) if len(a["end"])]
        return (int(min(starts)), int(max(ends))) if starts else (None, None)

    def fold_api_keys(self, start):
        acc = start()
        acc.add(self._api_arrays["key"])
        return acc

    def host_calls(self):
        from profattr.trace.calls import WholeCalls

        return WholeCalls(self.api_calls())

    def api_calls(self) -> dict:
        a = self._api_arrays
        kinds = self._api_kinds()
        sel = kinds >= 0
        return self.claims.events({"tid": a["tid"][sel], "start": a["start"][sel], "end": a["end"][sel],
                                   "kind": kinds[sel]}, "api_calls")

    def cpu_samples(self):
        return None  # torch traces hold no CPU samples

    def sampling_period_ns(self):
        return None

    def kernel_configs(self) -> dict:
        g = self._gpu_arrays
        lo, hi = self.claims.window()
        sel = (g["kind"] == KIND_KERNEL) & (g["start"] >= lo) & (g["end"] <= hi) & (g["end"] >= g["start"])
        return {"device": g["device"][sel], "name": g["name"][sel], "gx": g["gx"][sel], "gy": g["gy"][sel],
                "gz": g["gz"][sel], "bx": g["bx"][sel], "by": g["by"][sel], "bz": g["bz"][sel],
                "start": g["start"][sel], "duration": g["end"][sel] - g["start"][sel]}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
