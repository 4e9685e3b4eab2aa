"""Read Nsight Compute's raw CSV (`ncu --import R --csv --page raw`, written by `profattr drill`): one row per
profiled kernel launch, no ncu needed.

The file has a header row of metric names, a row of their units, then one row per launch. Units are scaled per
column (`us` or `msecond`, `Gbyte/s` or `Tbyte/s`, `Ghz`, `%`) and numbers may carry thousands separators; every
value is converted by its column's unit into the unit its field is named for (`duration_ns`, `dram_bytes`,
`dram_bytes_per_s`). `read_ncu_csv` returns an `NcuCsv` of `NcuKernel`s, or raises ProfattrError naming what is
wrong: a missing column (with the section that collects it), no kernel rows, a truncated or foreign file.

One place validates the format: a byte-order mark is ignored; a kernel row that cannot be trusted (fields missing or
extra, text where a number belongs, no value where the verdicts need one, a negative count or duration) is left
out, counted in `skipped` and said in one `warning:` line (so is a row repeating an earlier row's kernel ID), and
only a file with no usable row is an error. The
Occupancy section is optional: without it occupancy is not reported (the verdicts need none of it) and
`missing_sections` says so.

DRAM bytes: ncu 2025.3.1's four drill sections (SpeedOfLight, MemoryWorkloadAnalysis, LaunchStats, Occupancy)
record no byte count, only `dram__bytes.sum.per_second` (read + write) and `gpu__time_duration.sum`; their product
is the bytes. Where a CSV has `dram__bytes_read.sum` and `dram__bytes_write.sum` (other sections or --metrics),
their sum is used instead; `dram_bytes_source` says which.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from profattr.errors import ProfattrError, warn
from profattr.run_record import RunRecord, or_empty

SCHEMA_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "LaunchStats", "Occupancy")
TESTED_VERSION = "2025.3.1"

# field -> (column as ncu names it, section that collects it; None: every raw export has it)
REQUIRED = {
    "id": ("ID", None),
    "name": ("Kernel Name", None),
    "grid_x": ("launch__grid_dim_x", "LaunchStats"),
    "grid_y": ("launch__grid_dim_y", "LaunchStats"),
    "grid_z": ("launch__grid_dim_z", "LaunchStats"),
    "grid_size": ("launch__grid_size", "LaunchStats"),
    "block_x": ("launch__block_dim_x", "LaunchStats"),
    "block_y": ("launch__block_dim_y", "LaunchStats"),
    "block_z": ("launch__block_dim_z", "LaunchStats"),
    "block_size": ("launch__block_size", "LaunchStats"),
    "registers_per_thread": ("launch__registers_per_thread", "LaunchStats"),
    "waves_per_sm": ("launch__waves_per_multiprocessor", "LaunchStats"),
    "duration_ns": ("gpu__time_duration.sum", "SpeedOfLight"),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "SpeedOfLight"),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SpeedOfLight"),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "SpeedOfLight"),
    "dram_bytes_per_s": ("dram__bytes.sum.per_second", "MemoryWorkloadAnalysis"),
    "sm_count": ("device__attribute_multiprocessor_count", None),
}
# sections a report may lack: their columns are read when there, and said missing when not
OPTIONAL_SECTIONS = {"Occupancy": ("sm__warps_active.avg.pct_of_peak_sustained_active",
                                   "sm__maximum_warps_per_active_cycle_pct")}
OPTIONAL = {
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",  # Occupancy
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",  # Occupancy
    "cluster_size": "launch__cluster_size",  # LaunchStats, 0 when the launch has no clusters
    "sm_clock_hz": "gpc__cycles_elapsed.avg.per_second",  # SpeedOfLight: the clock ncu ran the GPU at
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "device": "Device",
    "stream": "Stream",
}
# LaunchStats/Occupancy: CTAs one SM holds at once, as each resource limits it (the smallest is the limit)
CTA_LIMITS = {"blocks": "launch__occupancy_limit_blocks", "registers": "launch__occupancy_limit_registers",
              "shared memory": "launch__occupancy_limit_shared_mem", "warps": "launch__occupancy_limit_warps",
              "barriers": "launch__occupancy_limit_barriers"}
_NO_VALUE = {"", "n/a", "no data", "nan", "-"}
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_TIME = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_BYTES = re.compile(r"^(k|m|g|t|p|ki|mi|gi|ti)?(?:byte|b)(?:/(s|second))?$")
_HZ = re.compile(r"^(k|m|g|t)?hz$")


@dataclass(frozen=True)
class NcuKernel:
    """One profiled launch, in the units its field names say."""

    id: int
    name: str  # as ncu printed it: the function name, or the demangled name with templates
    short_name: str  # the function name alone (no return type, namespace, template arguments, parameters)
    grid: tuple  # CTAs per dimension (x, y, z)
    block: tuple  # threads per dimension (x, y, z)
    grid_size: int  # CTAs in the launch
    block_size: int  # threads per CTA
    duration_ns: float
    dram_bytes: float  # DRAM read + write
    dram_bytes_source: str
    dram_bytes_per_s: float
    dram_throughput_pct: float  # % of peak sustained DRAM throughput
    sm_throughput_pct: float  # SpeedOfLight's Compute (SM) throughput, % of peak
    memory_throughput_pct: float  # SpeedOfLight's Memory throughput: the busiest of DRAM, L2, L1, % of peak
    achieved_occupancy_pct: Optional[float]  # active warps per SM, % of the SM's maximum (None: no Occupancy)
    theoretical_occupancy_pct: Optional[float]
    waves_per_sm: float  # CTAs / (CTAs the GPU holds at once)
    ctas_per_sm: Optional[int]  # CTAs one SM holds at once (the smallest occupancy limit), when recorded
    ctas_per_sm_limiter: Optional[str]  # the resource that sets it (registers, shared memory, warps, ...)
    registers_per_thread: int
    sm_count: int
    cluster_size: Optional[int]
    sm_clock_hz: Optional[float]
    device: Optional[str]
    stream: Optional[str]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["grid"], out["block"] = list(self.grid), list(self.block)
        return out


@dataclass(frozen=True)
class NcuCsv:
    """The kernels of one raw CSV, with the drill's run.json beside it (None when there is none)."""

    path: Path
    kernels: tuple
    ncu_version: Optional[str]
    run: Optional[RunRecord]
    run_path: Optional[Path]
    skipped: tuple = ()  # (reason, rows) of the kernel rows left out
    missing_sections: tuple = ()  # optional sections the report was collected without

    @property
    def skipped_rows(self) -> int:
        return sum(n for _, n in self.skipped)


class DamagedRow(ValueError):
    """A kernel row that cannot be trusted; the message says why (the reason it is counted under)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class NoKernelsError(ProfattrError):
    """The CSV is well formed but holds no kernel row (the kernel regex matched no launch)."""

    def __init__(self, message: str, regex: Optional[str], run: Optional[RunRecord]):
        super().__init__(message)
        self.regex = regex
        self.run = run


def short_name(name: str) -> str:
    """`void cutlass::device_kernel<...>(Params)` -> `device_kernel`; a plain name stays as it is."""
    s = name.strip().replace("(anonymous namespace)", "anonymous")
    if s.startswith("void "):
        s = s[len("void "):]
    cuts = [i for i in (s.find("<"), s.find("(")) if i > 0]
    s = s[: min(cuts)] if cuts else s
    return s.rsplit("::", 1)[-1].strip() or name


def run_json_for(csv_path: Path) -> Path:
    """NAME.run.json beside NAME.ncu.csv (or beside NAME.csv)."""
    name = csv_path.name
    for suffix in (".ncu.csv", ".csv"):
        if name.endswith(suffix):
            return csv_path.with_name(name[: -len(suffix)] + ".run.json")
    return csv_path.with_name(name + ".run.json")


def load_drill_run(csv_path: Path) -> tuple:
    """(RunRecord or None, its path or None): the drill's run.json beside the CSV, if readable."""
    from profattr import run_record

    path = run_json_for(csv_path)
    run = run_record.optional(path)  # one there that cannot be trusted is an error, not an unknown drill
    return (run, path) if run is not None else (None, None)


def _version_text(run: Optional[RunRecord]) -> str:
    version = run.ncu_version if run is not None else None
    return f"ncu {version} (run.json)" if version else "the ncu version is not recorded (no run.json beside it)"


def _needed_sections(columns) -> str:
    sections = sorted({REQUIRED[f][1] for f in REQUIRED if REQUIRED[f][0] in columns and REQUIRED[f][1]})
    return ", ".join(sections) or "none"


def _number(text: str) -> Optional[float]:
    s = text.strip().replace(",", "")
    if s.lower() in _NO_VALUE:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def unit_factor(unit: str, kind: str) -> Optional[float]:
    """Factor from `unit` to the base of `kind` (time: ns, bytes: byte, rate: byte/s, hz, pct, count); None when
    the unit is not one of that kind."""
    u = unit.strip().lower()
    if kind == "time":
        return _TIME.get(u)
    if kind in ("bytes", "rate"):
        m = _BYTES.match(u)
        if not m or (kind == "rate") != bool(m.group(2)):
            return None
        return _PREFIX[m.group(1) or ""]
    if kind == "hz":
        m = _HZ.match(u)
        return _PREFIX[m.group(1) or ""] if m else None
    if kind == "pct":
        return 1.0 if u == "%" else None
    return 1.0  # counts (CTAs, registers, waves): their unit names the thing counted


KIND = {"duration_ns": "time", "dram_bytes_per_s": "rate", "dram_read_bytes": "bytes", "dram_write_bytes": "bytes",
        "sm_clock_hz": "hz", "dram_throughput_pct": "pct", "sm_throughput_pct": "pct", "memory_throughput_pct": "pct",
        "achieved_occupancy_pct": "pct", "theoretical_occupancy_pct": "pct"}
_TEXT = {"name", "device", "stream"}
EXAMPLE_UNITS = {"time": "us or msecond", "rate": "Gbyte/s", "bytes": "Mbyte", "hz": "Ghz", "pct": "%"}


def _rows(path: Path) -> list:
    from profattr import inputs

    inputs.regular_file(path, "an ncu raw CSV (NAME.ncu.csv, written by `profattr drill`)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfattrError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not raw.strip():
        raise ProfattrError(f"{path}: the file is empty; export the drill's report again with "
                            f"`ncu --import NAME.ncu-rep --csv --page raw > {path.name}`")
    if b"\x00" in raw[:4096]:
        raise ProfattrError(f"{path}: a binary file, not a CSV (an .ncu-rep? turn it into the CSV with "
                            "`ncu --import REPORT --csv --page raw`)")
    if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (an editor or Excel saved it): not part of the header
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    # ncu prefixes its own messages with ==PROF==, ==WARNING==, ==ERROR==: they are not part of the table
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    try:
        return list(csv.reader(lines, strict=True))
    except csv.Error as exc:
        raise ProfattrError(f"{path}: not a well-formed CSV ({exc}); the file is truncated or was not written by "
                            "`ncu --csv`") from None


def read_ncu_csv(path, run: Optional[RunRecord] = None) -> NcuCsv:
    """The launches in an ncu raw CSV. `run`: the drill's run.json (default: NAME.run.json beside the CSV)."""
    path = Path(path)
    run_path = None
    if run is None:
        run, run_path = load_drill_run(path)
    rows = _rows(path)
    if not rows or "ID" not in rows[0] or "Kernel Name" not in rows[0]:
        raise ProfattrError(f"{path}: not an ncu raw CSV (its first row has no 'ID' and 'Kernel Name' columns); "
                            "profattr reads `ncu --import REPORT --csv --page raw`")
    header = rows[0]
    if len(set(header)) != len(header):
        raise ProfattrError(f"{path}: the header names a column twice; not an ncu raw CSV")
    missing = [col for col, _ in REQUIRED.values() if col not in header]
    if missing:
        raise ProfattrError(
            f"{path}: the CSV lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"({_version_text(run)}); profattr reads the raw page of a report collected with the sections "
            f"{', '.join(SCHEMA_SECTIONS)} (column names as in ncu {TESTED_VERSION}); this CSV has the "
            f"columns of: {_needed_sections(header)}")
    if len(rows) < 2:
        raise ProfattrError(f"{path}: a header and nothing else (no units row): the file is truncated")
    units = rows[1]
    col = {name: i for i, name in enumerate(header)}
    if len(units) != len(header) or _number(units[col["ID"]]) is not None:
        raise ProfattrError(f"{path}: the second row is not ncu's units row (the CSV is truncated or was exported "
                            "without units)")
    factors = {}
    for field_name, column in [(f, c) for f, (c, _) in REQUIRED.items()] + list(OPTIONAL.items()):
        if field_name in _TEXT or column not in col or field_name in ("id",):
            continue
        kind = KIND.get(field_name, "count")
        factor = unit_factor(units[col[column]], kind)
        if factor is None:
            raise ProfattrError(f"{path}: column {column} is in {units[col[column]]!r}, a unit profattr cannot "
                                f"convert to its {kind} (expected e.g. {EXAMPLE_UNITS[kind]})")
        factors[field_name] = factor
    data = rows[2:]
    if not data:
        drilled = or_empty(run)
        regex = drilled.drill_kernel_regex
        names = [n for f in drilled.drill_families for n in f.get("names") or []]
        text = (f"{path}: no kernel was profiled (the CSV has its header and units but no kernel row): the kernel "
                f"regex {regex!r} matched no launch inside the window" if regex else
                f"{path}: no kernel was profiled (the CSV has its header and units but no kernel row): the kernel "
                "regex matched no launch inside the window")
        if names:
            text += f"; the capture's top kernels were {', '.join(names)}"
        raise NoKernelsError(text, regex, run)
    if len(data[-1]) < len(header):  # the file was cut short: what else is missing cannot be told
        raise ProfattrError(f"{path}: row {len(rows)} has {len(data[-1])} fields where the header has {len(header)}: "
                            "the CSV is truncated; export the drill's report again")
    kernels, skipped, first, seen = [], {}, None, set()
    for i, row in enumerate(data):
        try:
            kernel = _kernel(i + 3, row, header, col, factors)
            if kernel.id in seen:  # ncu numbers the launches of a report once each: a repeat is a copy
                raise DamagedRow("repeating an earlier row's kernel ID", f"row {i + 3} repeats kernel ID {kernel.id}")
            seen.add(kernel.id)
            kernels.append(kernel)
        except DamagedRow as exc:
            skipped[exc.reason] = skipped.get(exc.reason, 0) + 1
            first = first or exc.detail
    if not kernels:
        raise ProfattrError(f"{path}: none of its {len(data)} kernel rows can be read ({first}); export the drill's "
                            f"report again with `ncu --import NAME.ncu-rep --csv --page raw > {path.name}`")
    if skipped:
        n = sum(skipped.values())
        warn(f"{path}: {n} of {len(data)} kernel row{'s' if len(data) > 1 else ''} left out "
             f"({'; '.join(f'{c} {r}' for r, c in skipped.items())}; first: {first}); the verdicts cover the rest")
    missing = tuple(section for section, columns in OPTIONAL_SECTIONS.items() if not any(c in col for c in columns))
    if missing:
        warn(f"{path}: collected without the {', '.join(missing)} section{'s' if len(missing) > 1 else ''}: "
             "occupancy is not reported (the verdicts need none of it); add `--section Occupancy` to the ncu "
             "command for it")
    version = run.ncu_version if run is not None else None
    return NcuCsv(path=path, kernels=tuple(kernels), ncu_version=version, run=run, run_path=run_path,
                  skipped=tuple(skipped.items()), missing_sections=missing)


NON_NEGATIVE = ("duration_ns", "dram_bytes_per_s", "grid_x", "grid_y", "grid_z", "grid_size", "block_x", "block_y",
                "block_z", "block_size", "registers_per_thread", "waves_per_sm", "dram_throughput_pct",
                "sm_throughput_pct", "memory_throughput_pct")
POSITIVE = ("sm_count", "grid_size", "block_size")


def _kernel(line: int, row: list, header: list, col: dict, factors: dict) -> NcuKernel:
    """One kernel row, or DamagedRow saying why it cannot be trusted."""
    if len(row) != len(header):
        raise DamagedRow("with fields missing or extra", f"row {line} has {len(row)} fields where the header has "
                                                         f"{len(header)}")

    def value(field_name: str, required: bool = True):
        column = REQUIRED[field_name][0] if field_name in REQUIRED else OPTIONAL[field_name]
        if column not in col:
            return None
        text = row[col[column]]
        if field_name in _TEXT:
            return text.strip() or None
        number = _number(text)
        if number is None or not math.isfinite(number):
            if text.strip().lower() in _NO_VALUE:
                if required:
                    raise DamagedRow("without a value the verdicts need", f"row {line} (kernel ID "
                                     f"{row[col['ID']]!r}) has no value in {column}: ncu did not measure it")
                return None
            raise DamagedRow("with text where a number belongs", f"row {line} (kernel ID {row[col['ID']]!r}) has "
                             f"{text[:40]!r} in {column}")
        if number < 0 and field_name in NON_NEGATIVE or number <= 0 and field_name in POSITIVE:
            raise DamagedRow("with a value out of range", f"row {line} (kernel ID {row[col['ID']]!r}) has {number:g} "
                             f"in {column}")
        return number * factors.get(field_name, 1.0)

    kernel_id = _number(row[col["ID"]])
    name = row[col["Kernel Name"]].strip()
    if kernel_id is None or not math.isfinite(kernel_id) or kernel_id != int(kernel_id):
        raise DamagedRow("without a kernel ID", f"row {line} has {row[col['ID']][:40]!r} as its ID")
    if not name:
        raise DamagedRow("without a kernel name", f"row {line} (kernel ID {row[col['ID']]!r}) has no name")
    duration = value("duration_ns")
    rate = value("dram_bytes_per_s")
    read, write = value("dram_read_bytes", False), value("dram_write_bytes", False)
    if read is not None and write is not None:
        dram_bytes, source = read + write, "dram__bytes_read.sum + dram__bytes_write.sum"
    else:
        dram_bytes, source = rate * duration * 1e-9, "dram__bytes.sum.per_second x gpu__time_duration.sum"
    cluster = value("cluster_size", False)
    limits = {what: _number(row[col[c]]) for what, c in CTA_LIMITS.items() if c in col}
    limits = {what: v for what, v in limits.items() if v is not None and v > 0}
    least = min(limits.values()) if limits else None
    limiter = " and ".join(what for what, v in limits.items() if v == least) if limits else None
    return NcuKernel(
        id=int(kernel_id), name=name, short_name=short_name(name),
        grid=(int(value("grid_x")), int(value("grid_y")), int(value("grid_z"))),
        block=(int(value("block_x")), int(value("block_y")), int(value("block_z"))),
        grid_size=int(value("grid_size")), block_size=int(value("block_size")), duration_ns=duration,
        dram_bytes=dram_bytes, dram_bytes_source=source, dram_bytes_per_s=rate,
        dram_throughput_pct=value("dram_throughput_pct"), sm_throughput_pct=value("sm_throughput_pct"),
        memory_throughput_pct=value("memory_throughput_pct"),
        achieved_occupancy_pct=value("achieved_occupancy_pct", False),
        theoretical_occupancy_pct=value("theoretical_occupancy_pct", False), waves_per_sm=value("waves_per_sm"),
        ctas_per_sm=int(least) if limits else None, ctas_per_sm_limiter=limiter,
        registers_per_thread=int(value("registers_per_thread")), sm_count=int(value("sm_count")),
        cluster_size=int(cluster) if cluster is not None else None, sm_clock_hz=value("sm_clock_hz", False),
        device=value("device", False), stream=value("stream", False))
