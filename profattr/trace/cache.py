"""The budget cache: a capture's op store (trace/store.py), kept in the user's cache folder so that diff, report and
repeated budgets skip the SQLite read.

- Where: $PROFATTR_CACHE/opstore, else $XDG_CACHE_HOME/profattr/opstore, else ~/.cache/profattr/opstore; never
  beside the capture.
- Key: the file's identity (device, inode, size, mtime_ns), a hash of its first and last MiB, and READER_VERSION
  (bumped whenever what the reader makes changes).
- Size: at most $PROFATTR_CACHE_MAX_MB (default 4096) MB; the least recently used entries go first.
- Off: `--no-cache` or PROFATTR_NO_CACHE=1 (the store is then built in a temporary folder and removed).
- A damaged entry is ignored, removed and rebuilt: the cache is never the reason a budget fails.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from profattr import cache_keys, progress
from profattr.cache_keys import enabled  # noqa: F401 (the caches' switch: PROFATTR_NO_CACHE)
from profattr.trace import store as opstore
from profattr.trace import store_build

READER_VERSION = "3"  # 2: ops carry their launch shape (grid, block, registers); 3: and replays linked by graph
DEFAULT_MAX_MB = 4096


def cache_root() -> Path:
    return cache_keys.cache_root("opstore")


def max_bytes() -> int:
    try:
        return int(float(os.environ.get("PROFATTR_CACHE_MAX_MB", DEFAULT_MAX_MB)) * 1024 * 1024)
    except ValueError:
        return DEFAULT_MAX_MB * 1024 * 1024


def capture_key(path) -> str:
    """The cache key of a capture file: identity, content hash of its ends, reader version."""
    return cache_keys.file_key(path, f"{READER_VERSION}:{opstore.FORMAT}")


class StoreSource:
    """The reader interface of a capture backed by its op store: ops, ranges, graph launches, node creation and
    strings come from the store; anything else (api calls, kernel configs, ...) from the open export."""

    format = "nsys"

    def __init__(self, export, store: "opstore.OpStore", temporary: bool = False, cached: bool = False):
        self.export = export
        self.store = store
        self.temporary = temporary
        self.cached = cached  # True when the store was found in the cache (a warm run)
        self.path = export.path
        self.nsys_version = store.meta.get("nsys_version")
        self.schema_version = store.meta.get("schema_version")
        self.gpus = store.meta.get("gpus") or []
        links = store.meta.get("replay_links")
        if links is not None and export.claims.replay_links is None:  # a warm run says it again
            from profattr.trace import graph_replays, nsys_tables

            nsys_tables.note_replay_links(export, graph_replays.ReplayLinks.from_dict(links))

    @property
    def tool_version(self):
        return self.nsys_version

    def ops(self, include_memory: bool = True):
        if not include_memory:
            return self.export.ops(include_memory=False)
        return self.export.claims.ops(self.store.ops())  # the reader's checks (validate.Claims.ops)

    def time_windows(self, size: int | None = None):
        """The store's windows of ops (None when not in start order), each through the reader's checks; what they
        skip is counted over all windows."""
        windows = self.store.time_windows(size)
        if windows is None:
            return None
        return self._checked(windows)

    def _start_sample(self, most: int = 1 << 20) -> np.ndarray:
        """Every k-th GPU op start of the store, at most `most` of them, read a window at a time: enough for the
        plausible time range (validate.time_window: a median and percentiles)."""
        rows = self.store.rows
        step = max(1, rows // most)
        parts = [self.store.column("start", lo, hi)[(-lo) % step::step] for lo, hi in self.store.bounds()]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _checked(self, windows):
        from profattr.trace.validate import Claims

        claims = self.export.claims
        window = self._window()
        totals: dict = {}
        for ops in windows:
            part = Claims(claims.path, names=claims.names)
            part._window = window
            ops = part.ops(ops)
            for table, reasons in part.skipped.items():
                entry = totals.setdefault(table, {})
                for reason, n in reasons.items():
                    entry[reason] = entry.get(reason, 0) + n
            yield ops
        for table, reasons in totals.items():
            for reason, n in reasons.items():
                if reason != "rows":
                    claims.record(table, reason, n)

    def _window(self) -> tuple:
        """The reader's time range (validate.Claims.window): from the store's kernel starts on disk when they are in
        start order (the same window as from all kernel starts in memory), else from a sample of the op starts."""
        starts = self.store.sorted_kernel_starts()
        claims = self.export.claims
        return claims.window_sorted(starts) if starts is not None else claims.window(self._start_sample())

    def _sorted_window(self) -> None:
        """Fix the time range from the store's kernel starts when they are in start order (else the reader reads
        every kernel start when a check first needs it)."""
        starts = self.store.sorted_kernel_starts()
        if starts is not None:
            self.export.claims.window_sorted(starts)

    def ranges(self):
        self._sorted_window()
        return self.export.claims.ranges(self.store.ranges())

    def graph_launches(self):
        self._sorted_window()
        return self.export.claims.events(self.store.graph_launches(), "graph_launches")

    def node_creation(self):
        self._sorted_window()
        return self.export.claims.events(self.store.node_creation(), "node_creation")

    def strings(self, ids):
        found = self.store.strings(ids)
        rest = [i for i in {int(i) for i in ids if i is not None and int(i) >= 0} if i not in found]
        if rest:  # a string the store did not keep (not a kernel name): ask the export
            found.update(self.export.strings(rest))
        return found

    # --- the rest of the reader interface (protocol.py Reader): the export's own ---------------------------------
    @property
    def claims(self):
        return self.export.claims

    def nsys_tables(self):
        return self.export

    def launch_gpu_starts(self):
        """From the store, a window of rows at a time (trace/nsys_graphs.py), unless the export traced whole-graph
        replays (a table the store does not hold): then the export's SQL."""
        from profattr.trace import nsys_graphs

        if self._graph_traced():
            return self.export.launch_gpu_starts()
        return nsys_graphs.store_launch_gpu_starts(self.store)

    def gpu_interval_windows(self):
        from profattr.trace import nsys_graphs

        if self._graph_traced():
            return self.export.gpu_interval_windows()
        return nsys_graphs.store_gpu_windows(self.store)

    def _graph_traced(self) -> bool:
        from profattr.trace.nsys_graphs import GRAPH_TRACE

        return bool(self.export.has(GRAPH_TRACE) and self.export.count(GRAPH_TRACE))

    def api_calls(self) -> dict:
        return self.export.api_calls()

    def fold_api_keys(self, start):
        return self.export.fold_api_keys(start)

    def host_calls(self):
        return self.export.host_calls()

    def record_span(self) -> tuple:
        return self.export.record_span()

    def kernel_configs(self) -> dict:
        """The export's kernel_configs, from the store's kernel columns (the same rows and values: the store holds
        every kernel row with its device, name id, packed grid and block, start and end); from SQL when a value
        did not fit its packed field (-1) or the kernel rows are not the store's first segment."""
        configs = self.store.kernel_configs()
        if configs is None:
            return self.export.kernel_configs()
        return self.export.claims.kernel_configs(configs)

    def cpu_samples(self):
        return self.export.cpu_samples()

    def sampling_period_ns(self):
        return self.export.sampling_period_ns()

    def torch_ops(self):
        return None

    def python_frames(self):
        return None

    def close(self) -> None:
        if self.temporary:
            shutil.rmtree(self.store.folder.parent, ignore_errors=True)


def store_or_export(export):
    """The reader to compute with: an nsys export's op store (cached), else the reader itself (another format, or
    damaged rows, which the export's own reader finds, counts and hides: trace/validate.py)."""
    from profattr.trace.reader import DamagedValues, Export

    if not isinstance(export, Export):
        return export
    try:
        return open_store(export)
    except (DamagedValues, TypeError, ValueError, OverflowError):
        return export


def open_store(export) -> StoreSource:
    """The store of an open nsys export: from the cache (built there on a miss), or a temporary one."""
    if not enabled():
        return _temporary(export)
    root = cache_root()
    try:
        key = capture_key(export.path)
        entry = root / key
        if entry.exists():
            try:
                found = opstore.OpStore(entry)
                _touch(entry)
                return StoreSource(export, found, cached=True)
            except Exception:  # damaged or from another format: rebuild it
                shutil.rmtree(entry, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        return _temporary(export)  # no writable cache folder: still never beside the capture
    try:
        with progress.stage(f"reading {Path(export.path).name}"):
            store_build.build(export, work / "store")
        try:
            os.replace(work / "store", entry)
        except OSError:  # another process stored it first: use ours from the temporary folder
            return StoreSource(export, opstore.OpStore(work / "store"), temporary=True)
        shutil.rmtree(work, ignore_errors=True)
        _touch(entry)
        evict(root, keep=entry)
        return StoreSource(export, opstore.OpStore(entry))
    except OSError:  # disk full, permissions: build it where temporary files go
        shutil.rmtree(work, ignore_errors=True)
        return _temporary(export)


def _temporary(export) -> StoreSource:
    work = Path(tempfile.mkdtemp(prefix="profattr-store-"))
    try:
        with progress.stage(f"reading {Path(export.path).name}"):
            return StoreSource(export, store_build.build(export, work / "store"), temporary=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _touch(entry: Path) -> None:
    """Mark an entry used now (its LRU time)."""
    try:
        (entry / "used").write_text(str(time.time()))
    except OSError:
        pass


def _entry_size(entry: Path) -> int:
    return sum(f.stat().st_size for f in entry.iterdir() if f.is_file())


def evict(root: Path, keep: Path | None = None) -> None:
    """Remove least recently used entries until the cache fits in max_bytes(); temporary build folders older than a
    day are removed too."""
    entries = []
    for entry in root.iterdir():
        try:
            if entry.name.startswith("."):
                if time.time() - entry.stat().st_mtime > 86400:
                    shutil.rmtree(entry, ignore_errors=True)
                continue
            used = entry / "used"
            stamp = used.stat().st_mtime if used.exists() else entry.stat().st_mtime
            entries.append((stamp, entry, _entry_size(entry)))
        except OSError:
            continue
    total = sum(size for _, _, size in entries)
    for _, entry, size in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes():
            break
        if keep is not None and entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= size


def describe() -> dict:
    """Where the cache is and what it holds (for tests and `--help` texts)."""
    root = cache_root()
    entries = [e for e in root.iterdir() if not e.name.startswith(".")] if root.exists() else []
    return {"root": str(root), "enabled": enabled(), "entries": len(entries),
            "bytes": sum(_entry_size(e) for e in entries), "max_bytes": max_bytes(),
            "reader_version": READER_VERSION, "meta": [json.loads((e / "meta.json").read_text()).get("rows")
                                                       for e in entries if (e / "meta.json").exists()]}


def store_while(paths, work) -> None:
    """Run `work()` (a command's imports) on a thread while the one nsys export among `paths` that has no op store
    yet is stored in the cache here: the two longest waits of a first look at a capture overlap, as in `budget`
    (attribute/result_cache.py). Nothing is built with the cache off, or when two or more exports need a store (the
    report reads those in processes of its own: report/read_pool.py); anything that goes wrong is left for the command to meet when it
    reads that capture. `work`'s error is raised here."""
    import threading

    failed: list = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 (raised again on the calling thread)
            failed.append(exc)

    thread = threading.Thread(target=run, name="profattr-import", daemon=True)
    thread.start()
    try:
        if enabled():
            todo = [p for p in (unstored_export(p) for p in paths) if p is not None]
            if len({os.path.realpath(p) for p in todo}) == 1:
                build_store(todo[0])
    finally:
        thread.join()
    if failed:
        raise failed[0]


def unstored_export(path) -> Path | None:
    """The SQLite export a capture is read from (cache_keys.current_export) when the cache is on and has no store of
    it yet; else None."""
    if not enabled():
        return None
    export = cache_keys.current_export(path)
    try:
        return None if export is None or (cache_root() / capture_key(export)).exists() else export
    except OSError:
        return None


def quiet() -> None:
    """A worker process's start: the parent draws the one progress line."""
    os.environ["PROFATTR_PROGRESS"] = "0"


def build_store(path: Path) -> int:
    """Store the export at `path` in the cache; 1 when built here, 0 when it was there or could not be read."""
    from profattr.trace.reader import open_export

    try:
        with open_export(path) as export:
            source = open_store(export)
            built = not source.cached
            source.close()
        return int(built)
    except Exception:  # the command reading this capture meets it again, and says what it is
        return 0
