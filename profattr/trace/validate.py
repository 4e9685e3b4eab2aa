"""What a capture claims, checked before anything is computed from it.

Nsight Systems exports: when the export is opened (`check_structure`, no row read), every table profattr reads must
have the columns it needs, declared with the types the nsys schema gives them; a table without them (or with a
`start` column declared TEXT) is an error naming the table. A row whose values are not what the schema says (NULL
or text where an integer belongs; an id outside what its array holds: deviceId, streamId and name ids in 31 bits,
correlationId in 32) is skipped and counted. Checking every row costs a scan of every table, so it is done when a
read meets a damaged value (the fetch of a NULL or a text fails; the queries mark an id that does not fit with -1,
which `Claims.ops` drops): then `hide_damaged_rows` counts the damaged rows per reason and puts a TEMP view of the
same name over the table that leaves them out, the queries of queries/ read the table through it unchanged, and
the read is done again. A table whose every row is damaged is an error naming it.

Every reader (`Claims`, on the arrays it yields): a GPU op must end at or after its start, and it, its launch call,
NVTX ranges and graph events must lie inside the capture's time range. That range is the session nsys recorded
(ANALYSIS_DETAILS: export times are ns since the session started, so 0..duration) when the bulk of the GPU work lies
in it, else the bulk of the GPU work itself (the 1st to 99th percentile of its start times: a copy of an export
shifted in time, a torch-profiler trace), widened on both sides by its own length or one day, whichever is more.
Only times no capture holds are rejected (2^63-1, -2^62, a day away from everything else), and every time profattr
keeps lies within 2^62 ns of 0, so differences of two never overflow.

A skipped row is counted per table and reason (`Claims.skipped`): in the budget (`capture.skipped_rows` of its
JSON) and in one warning line on stderr. An op whose launch call is damaged keeps its GPU time but counts as not
launched (it belongs to no step).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from profattr.arrays import unique
from profattr.errors import ProfattrError, warn
from profattr.trace.ops import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Ops

INT31 = 2 ** 31 - 1
UINT32 = 2 ** 32 - 1
TIME_LIMIT_NS = 2 ** 62
DAY_NS = 86_400 * 10 ** 9

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
NSYS_NAMES = {KIND_KERNEL: KERNEL, KIND_MEMCPY: MEMCPY, KIND_MEMSET: MEMSET, "launch": RUNTIME, "ranges": NVTX,
              "graph_launches": RUNTIME, "api_calls": RUNTIME, "node_creation": "CUDA_GRAPH_EVENTS",
              "cpu_samples": "COMPOSITE_EVENTS"}
TORCH_NAMES = {KIND_KERNEL: "kernel events", KIND_MEMCPY: "gpu_memcpy events", KIND_MEMSET: "gpu_memset events",
               "launch": "cuda_runtime events", "ranges": "user_annotation events",
               "graph_launches": "cuda_runtime events", "api_calls": "cuda_runtime events",
               "node_creation": "graph events", "cpu_samples": "cpu samples"}


@dataclass(frozen=True)
class Column:
    """A column profattr reads: whether the table must have it, whether NULL is allowed, the integer range it must
    hold (None: any 64-bit integer), or TEXT."""

    name: str
    needed: bool = True  # False: may be absent (a column of some nsys versions only)
    nullable: bool = False
    low: int | None = None
    high: int | None = None
    text: bool = False


_GRID = [Column(c, needed=False) for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")]
_GPU_OP = [Column("start"), Column("end"), Column("deviceId", low=0, high=INT31),
           Column("correlationId", low=0, high=UINT32), Column("globalPid"),
           Column("streamId", needed=False, nullable=True, low=0, high=INT31),
           Column("graphNodeId", needed=False, nullable=True)]
_GRAPH_EVENTS = [Column("start"), Column("globalTid"), Column("graphNodeId", nullable=True),
                 Column("originalGraphNodeId", nullable=True)]
# tables read only when they have these columns (node creation needs both ids: trace/nsys_tables.py)
# (CPU samples: nsys_samples.py reads them only with these columns, and without them does without samples)
READ_ONLY_WITH = {"CUDA_GRAPH_EVENTS": {"graphNodeId", "originalGraphNodeId"},
                  "CUDA_GRAPH_NODE_EVENTS": {"graphNodeId", "originalGraphNodeId"},
                  "COMPOSITE_EVENTS": {"id", "start", "globalTid"},
                  "SAMPLING_CALLCHAINS": {"id", "symbol", "module", "stackDepth"}}
# no capture holds a time beyond +-2^62 ns (146 years): such a row is damaged even where the arrays never see it
# (a difference of two such times would overflow 64 bits inside SQLite)
_TIMES = [(f'(typeof("start") != \'integer\' OR "start" BETWEEN -{2 ** 62} AND {2 ** 62}) AND '
           f'(typeof("end") != \'integer\' OR "end" BETWEEN -{2 ** 62} AND {2 ** 62})', "a time beyond 2^62 ns")]
# table -> (columns, extra conditions (SQL, reason))
TABLES = {
    KERNEL: (_GPU_OP + [Column("demangledName", nullable=True, low=0, high=INT31),
                        Column("shortName", low=0, high=INT31)] + _GRID, _TIMES),
    MEMCPY: (_GPU_OP + [Column("copyKind", nullable=True, low=0, high=INT31)], _TIMES),
    MEMSET: (_GPU_OP, _TIMES),
    RUNTIME: ([Column("start"), Column("end"), Column("globalTid"), Column("correlationId", low=0, high=UINT32),
               Column("nameId")], _TIMES),
    NVTX: ([Column("start"), Column("end", nullable=True), Column("eventType"),
            Column("globalTid", nullable=True), Column("endGlobalTid", needed=False, nullable=True),
            Column("text", needed=False, nullable=True, text=True),
            Column("textId", needed=False, nullable=True), Column("domainId", needed=False, nullable=True)],
           [('"eventType" NOT IN (59, 60) OR typeof("globalTid") = \'integer\'', "a range without a thread")]
           + _TIMES),
    "CUDA_GRAPH_EVENTS": (_GRAPH_EVENTS, []),
    "CUDA_GRAPH_NODE_EVENTS": (_GRAPH_EVENTS, []),
    "COMPOSITE_EVENTS": ([Column("id"), Column("start"), Column("globalTid", nullable=True)],
                         [(f'typeof("start") != \'integer\' OR "start" BETWEEN -{2 ** 62} AND {2 ** 62}',
                           "a time beyond 2^62 ns")]),
    "SAMPLING_CALLCHAINS": ([Column("id"), Column("symbol"), Column("module"), Column("stackDepth")], []),
    "StringIds": ([Column("id"), Column("value", text=True)], []),
}


def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type (https://sqlite.org/datatype3.html, 3.1)."""
    t = (declared or "").upper()
    if "INT" in t:
        return "integer"
    if any(x in t for x in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not t or "BLOB" in t:
        return "none"
    if any(x in t for x in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def _conditions(col: Column) -> list:
    """(SQL that is true for a good value, reason when it is false) for one column; never NULL-valued."""
    q = f'"{col.name}"'
    kind = "text" if col.text else "an integer"
    typed = f"typeof({q}) = '{'text' if col.text else 'integer'}'"
    out = [(f"({q} IS NULL OR {typed})", f"{col.name} not {kind}") if col.nullable
           else (typed, f"{col.name} NULL or not {kind}")]
    if col.low is not None:
        out.append((f"({q} IS NULL OR NOT {typed} OR {q} BETWEEN {col.low} AND {col.high})",
                    f"{col.name} outside {col.low}..{col.high}"))
    return out


def _specs(export):
    """(table, columns present, conditions) of every table profattr reads that this export has."""
    for table, (columns, extra) in TABLES.items():
        if not export.has(table):
            continue
        declared = {row[1]: row[2] for row in export.query(f"pragma main.table_info('{table}')")}
        if not READ_ONLY_WITH.get(table, set()) <= set(declared):
            continue
        yield table, declared, [c for c in columns if c.name in declared], extra


def check_structure(export) -> None:
    """The tables profattr reads have the columns it needs, declared with the nsys schema's types (pragma only: no
    row is read); ProfattrError naming the table otherwise."""
    for table, declared, present, _ in _specs(export):
        for col in TABLES[table][0]:
            if col.needed and col.name not in declared:
                raise ProfattrError(f"{export.path}: table {table} has no column {col.name}; the export is "
                                    "damaged or not from Nsight Systems (export it again with `nsys export "
                                    "--type sqlite`)")
        for col in present:
            allowed = ("text", "none") if col.text else ("integer", "numeric", "none")
            if _affinity(declared[col.name]) not in allowed:
                raise ProfattrError(f"{export.path}: table {table} declares its column {col.name} as "
                                    f"{declared[col.name] or 'untyped'}, not {'TEXT' if col.text else 'INTEGER'}: "
                                    "the table is damaged (export it again with `nsys export --type sqlite`)")


def hide_damaged_rows(export) -> dict:
    """Every row of the tables profattr reads checked against the nsys schema (types, NULLs, id ranges); a table
    with damaged rows gets a TEMP view of its name that leaves them out. Returns {table: {reason: rows, "rows":
    total}}. A full scan of each table: run only once a read has met a damaged value."""
    skipped: dict = {}
    for table, _, present, extra in _specs(export):
        conditions = [c for col in present for c in _conditions(col)] + [(f"({sql})", r) for sql, r in extra]
        if not conditions:
            continue
        good = " AND ".join(sql for sql, _ in conditions)
        rows, bad = export.query(f'SELECT count(*), total(NOT ({good})) FROM main."{table}"')[0]
        rows, bad = int(rows), int(bad)
        if not bad:
            continue
        sums = ", ".join(f"total(NOT {sql})" for sql, _ in conditions)
        counts = export.query(f'SELECT {sums} FROM main."{table}"')[0]
        reasons = {reason: int(n) for (_, reason), n in zip(conditions, counts) if n}
        if bad == rows:
            detail = "; ".join(f"{reason}: {n}" for reason, n in reasons.items())
            raise ProfattrError(f"{export.path}: table {table} is damaged: none of its {rows} rows holds the values "
                                f"the nsys schema says ({detail}); export it again with `nsys export --type sqlite`")
        skipped[table] = {**reasons, "rows": bad}
        export.conn.execute(f'CREATE TEMP VIEW "{table}" AS SELECT * FROM main."{table}" WHERE {good}')
    return skipped


def _outside_session(count: int, first: int, last: int, session) -> bool:
    """Whether every GPU start (`count` of them, from `first` to `last`) lies outside the recorded session."""
    return session is not None and count > 0 and (first > session[1] or last < session[0])


def time_window(starts: np.ndarray, session=None) -> tuple:
    """(lo, hi) ns: the times a capture can hold (see the module docstring). `starts`: GPU op start times;
    `session`: (start, end) of the recorded session, or None."""
    s = starts[(starts > -TIME_LIMIT_NS) & (starts < TIME_LIMIT_NS)] if len(starts) else starts
    if len(s):
        middle = float(np.median(s))
        if session is not None and session[0] <= middle <= session[1]:
            lo, hi = session
        else:
            lo, hi = (int(x) for x in np.percentile(s, [1, 99]))
    elif session is not None:
        lo, hi = session
    else:
        lo = hi = 0
    return _with_margin(lo, hi)


def _with_margin(lo: int, hi: int) -> tuple:
    margin = max(hi - lo, DAY_NS)
    return max(lo - margin, -TIME_LIMIT_NS), min(hi + margin, TIME_LIMIT_NS)


def time_window_sorted(starts, session=None) -> tuple:
    """time_window of start times given sorted, as a sequence read one value at a time (len, [i]; a column of the
    op store on disk): the same median and percentiles from the few order statistics they need, so the starts are
    never all in memory."""
    n = len(starts)
    lo = bisect.bisect_right(starts, -TIME_LIMIT_NS)  # the kept starts, s, are starts[lo:hi]
    hi = bisect.bisect_left(starts, TIME_LIMIT_NS, lo)
    count = hi - lo
    if count == 0 or n == 0:
        return time_window(np.zeros(0, dtype=np.int64), session)
    at = lambda i: int(starts[lo + i])  # noqa: E731
    half = count // 2
    middle = float(np.median(np.array([at(half - 1), at(half)] if count % 2 == 0 else [at(half)], dtype=np.int64)))
    if session is not None and session[0] <= middle <= session[1]:
        return _with_margin(*session)
    # numpy's linear percentile: between the order statistics around (count - 1) * q, weighted by the fraction
    virtual = (count - 1) * (np.asarray([1, 99]) / 100)
    below = np.floor(virtual)
    bounds = []
    for v, b in zip(virtual.tolist(), below.tolist()):
        if v >= count - 1:
            a = z = at(count - 1)
        else:
            a, z = at(int(b)), at(int(b) + 1)
        bounds.append(int(np.quantile(np.array([a, z], dtype=np.int64), np.asarray([v - b]))[0]))
    return _with_margin(*bounds)


class Claims:
    """The checks of one reader's arrays, and what they skipped ({table: {reason: rows}}; each table's "rows" is its
    number of skipped rows)."""

    def __init__(self, path, session=None, names=None, skipped=None, starts=None):
        self.path = path
        self.session = session
        self.names = names or NSYS_NAMES
        self.skipped: dict = {t: dict(r) for t, r in (skipped or {}).items()}
        self._starts = starts  # () -> GPU op start times, for a window asked for before the ops were read
        self._window = None
        self.outside_session = None  # (GPU starts, first, last) when all of them lie outside the session
        self.replay_links = None  # graph_replays.ReplayLinks: replayed ops without a correlationId, linked or not

    # --- counting ------------------------------------------------------------------------------------------------
    def record(self, table: str, reason: str, rows: int) -> None:
        """Count `rows` skipped in `table` for `reason` (the same arrays checked again count once)."""
        if rows <= 0:
            return
        entry = self.skipped.setdefault(table, {})
        before = entry.get(reason, 0)
        if rows > before:
            entry[reason] = rows
            entry["rows"] = entry.get("rows", 0) + rows - before

    def total(self) -> int:
        return sum(r.get("rows", 0) for r in self.skipped.values())

    def warn(self) -> None:
        """One warning line on stderr when anything was skipped."""
        total = self.total()
        if not total:
            return
        parts = []
        for table, reasons in self.skipped.items():
            detail = ", ".join(f"{reason} {n}" for reason, n in reasons.items() if reason != "rows")
            parts.append(f"{table} {reasons.get('rows', 0)} ({detail})")
        warn(f"{self.path}: skipped {total} damaged row(s), left out of every figure: {'; '.join(parts)}")

    # --- the time range ------------------------------------------------------------------------------------------
    def window(self, starts: np.ndarray | None = None) -> tuple:
        """(lo, hi) ns of plausible times, fixed by the first GPU op start times it is given (or fetches)."""
        if self._window is None:
            if starts is None and self._starts is not None:
                starts = self._starts()
            starts = starts if starts is not None else np.zeros(0, dtype=np.int64)
            self._window = time_window(starts, self.session)
            s = starts[(starts > -TIME_LIMIT_NS) & (starts < TIME_LIMIT_NS)] if len(starts) else starts
            if len(s):
                self._note_session(len(s), int(s.min()), int(s.max()))
        return self._window

    def _note_session(self, count: int, first: int, last: int) -> None:
        """Say so when the GPU work lies entirely outside the session nsys recorded (valid times, but not the
        session's: a copy moved in time, or an export whose session record is damaged)."""
        if not _outside_session(count, first, last, self.session):
            return
        self.outside_session = (count, first, last)
        lo, hi = self.session
        warn(f"{self.path}: all {count} GPU ops lie outside the session nsys recorded (ANALYSIS_DETAILS: {lo}..{hi} "
             f"ns; the ops: {first}..{last} ns): the times were moved or the session record is damaged; the figures "
             "use the GPU work's own time range (export the report again for times that agree)")

    def why_no_work(self) -> str | None:
        """Why no GPU op is left, when it is because of their times: every op lay where no capture holds times."""
        outside = {t: r.get("a time outside the capture", 0) for t, r in self.skipped.items()}
        total = sum(outside.values())
        if not total:
            return None
        where = f"the session nsys recorded is {self.session[0]}..{self.session[1]} ns; " if self.session else ""
        return (f"{self.path}: no GPU work in the capture's time range: all {total} GPU op row(s) lie at times no "
                f"capture holds ({where}times beyond 2^62 ns or a day away from the rest are refused): the export's "
                "times are damaged; export the report again (`nsys export --type sqlite`)")

    def window_sorted(self, starts) -> tuple:
        """window() from every kernel start, given sorted as a sequence read a value at a time (an op store column,
        time_window_sorted): the same window without the starts in memory."""
        if self._window is None:
            self._window = time_window_sorted(starts, self.session)
            lo = bisect.bisect_right(starts, -TIME_LIMIT_NS)
            hi = bisect.bisect_left(starts, TIME_LIMIT_NS, lo)
            if hi > lo:
                self._note_session(hi - lo, int(starts[lo]), int(starts[hi - 1]))
        return self._window

    # --- checks ---------------------------------------------------------------------------------------------------
    def ops(self, ops: Ops) -> Ops:
        """`ops` without those that end before they start or lie outside the capture's time range; launch calls
        outside it are dropped (their op kept, not launched)."""
        if len(ops) == 0:
            return ops
        lo, hi = self.window(ops.start)
        start, end = ops.start, ops.end
        # the readers mark an id that does not fit its array (deviceId, streamId, name id: 31 bits; correlationId:
        # 32) with -1 rather than let it wrap (queries/gpu_kernels.sql)
        fits = (ops.device >= 0) & (ops.stream >= 0) & (ops.launch_key >= 0)
        inside = (start >= lo) & (start <= hi) & (end >= lo) & (end <= hi)
        ordered = end >= start
        keep = fits & inside & ordered
        if not keep.all():
            for code in unique(ops.kind[~keep]):
                of_kind = ops.kind == code
                table = self.names.get(int(code), f"ops of kind {int(code)}")
                self.record(table, "deviceId, streamId, name id or correlationId NULL, not an integer or beyond its range",
                            int((of_kind & ~fits).sum()))
                self.record(table, "end before start", int((of_kind & fits & inside & ~ordered).sum()))
                self.record(table, "a time outside the capture", int((of_kind & fits & ~inside).sum()))
            ops = ops.take(keep)
        launched = ops.launched
        far = launched & ((ops.launch_ns < lo) | (ops.launch_ns > hi))
        if far.any():
            self.record(self.names["launch"], "a launch call time outside the capture (its op kept, not launched)",
                        int(far.sum()))
            ops.launched = launched & ~far
            ops.launch_ns = np.where(far, -1, ops.launch_ns)
            ops.launch_tid = np.where(far, -1, ops.launch_tid)
        return ops

    def kernel_configs(self, configs: dict) -> dict:
        """Kernel configurations (arrays start, duration, ...) inside the time range, with a duration that fits it."""
        lo, hi = self.window()
        keep = (configs["start"] >= lo) & (configs["start"] <= hi) & (configs["duration"] >= 0) & (
            configs["duration"] <= hi - lo)
        return configs if keep.all() else {c: v[keep] for c, v in configs.items()}

    def ranges(self, frame):
        """NVTX ranges (a frame with start, end) that end at or after their start, inside the time range."""
        if len(frame) == 0:
            return frame
        lo, hi = self.window()
        start, end = frame["start"].to_numpy(), frame["end"].to_numpy()
        ordered = end >= start
        inside = (start >= lo) & (end <= hi)
        keep = ordered & inside
        if keep.all():
            return frame
        table = self.names["ranges"]
        self.record(table, "range end before start", int((inside & ~ordered).sum()))
        self.record(table, "range time outside the capture", int((~inside).sum()))
        return frame[keep].reset_index(drop=True)

    def events(self, arrays: dict | None, what: str) -> dict | None:
        """Arrays with `start` (and `end`): rows inside the time range (and ending at or after their start)."""
        if arrays is None or len(arrays["start"]) == 0:
            return arrays
        kept, dropped = self._events(arrays)
        self._record_events(what, dropped)
        return kept

    def events_in_parts(self, parts, what: str):
        """events() of arrays that come a part at a time: each part's rows kept, the rows left out counted once
        over all parts (when the last one has come)."""
        dropped = 0
        for arrays in parts:
            if len(arrays["start"]):
                arrays, n = self._events(arrays)
                dropped += n
            yield arrays
        self._record_events(what, dropped)

    def _events(self, arrays: dict) -> tuple:
        lo, hi = self.window()
        start = arrays["start"]
        keep = (start >= lo) & (start <= hi)
        if "end" in arrays:
            keep &= (arrays["end"] >= start) & (arrays["end"] <= hi)
        if keep.all():
            return arrays, 0
        return {k: v[keep] for k, v in arrays.items()}, int((~keep).sum())

    def _record_events(self, what: str, dropped: int) -> None:
        self.record(self.names[what], f"{what.replace('_', ' ')}: a time outside the capture or end before start",
                    dropped)


def session_of(export) -> tuple | None:
    """(0, duration) ns of the session an nsys export recorded (ANALYSIS_DETAILS), or None."""
    if not export.has("ANALYSIS_DETAILS") or "duration" not in export.columns("ANALYSIS_DETAILS"):
        return None
    rows = export.query("SELECT duration FROM ANALYSIS_DETAILS WHERE typeof(duration) = 'integer' LIMIT 1")
    if not rows or not 0 < rows[0][0] < TIME_LIMIT_NS:
        return None
    return 0, int(rows[0][0])
