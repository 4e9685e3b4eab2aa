"""Write a bottleneck report (report.md, details.md and their PNG charts) into a folder: what `profattr report` and the library's
`profattr.report` call once the report's data is collected (report/collect.py)."""
from __future__ import annotations

import re
from pathlib import Path

from profattr.errors import ProfattrError
from profattr.outputs import atomic_path, check_output, ensure_folder, write_text
from profattr.report.campaign import CAMPAIGN_CHART
from profattr.report.distribution_view import DISTRIBUTION_CHART
from profattr.report.timeline import TIMELINE_CHART

REPORT_FILE = "report.md"
CATEGORY_CHART = "categories.png"
LAUNCH_CHART = "launches.png"


def chart_slug(label: str) -> str:
    """A file-name-safe form of a label (charts are named after captures)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-.")
    return slug or "capture"


def output_files(data) -> dict:
    """role -> file name of every chart the report will write (the gap chart only where a gap was computed)."""
    files = {"categories": CATEGORY_CHART, "launches": LAUNCH_CHART}
    if data.captures:  # written by their sections (report/timeline.py, report/distribution_view.py)
        files.update({"timeline": TIMELINE_CHART, "distributions": DISTRIBUTION_CHART})
    if data.campaign:
        files["campaign"] = CAMPAIGN_CHART
    used = set(files.values())
    for cap in data.captures:
        if cap.gap is not None:
            name = f"gap-{chart_slug(cap.label)}.png"
            n = 2
            while name in used:
                name = f"gap-{chart_slug(cap.label)}-{n}.png"
                n += 1
            used.add(name)
            files[f"gap:{cap.label}"] = name
    return files


def write_report(data, out_dir: Path, force: bool = False) -> list:
    """Write report.md, details.md and the charts into `out_dir`; returns the paths written (report.md, details.md,
    then the charts). Refuses to replace any existing file without `force`."""
    from profattr.limits.chart import write_gap_chart
    from profattr.report import charts
    from profattr.report.campaign import write_campaign_chart
    from profattr.report.markdown import DETAILS_FILE, render_details, render_report

    files = output_files(data)
    targets = [out_dir / REPORT_FILE, out_dir / DETAILS_FILE] + [out_dir / f for f in files.values()]
    for target in targets:  # every file first: a refused report writes nothing
        check_target(target, out_dir, force)
    ensure_folder(out_dir)
    inputs = [c.as_input() for c in data.captures]
    with atomic_path(out_dir / files["categories"], force) as tmp:
        charts.write_category_chart(inputs, tmp)
    with atomic_path(out_dir / files["launches"], force) as tmp:
        charts.write_launch_chart(inputs, tmp)
    if "campaign" in files:
        with atomic_path(out_dir / files["campaign"], force) as tmp:
            write_campaign_chart(data.campaign, tmp)
    for cap in data.captures:
        role = f"gap:{cap.label}"
        if role in files:
            with atomic_path(out_dir / files[role], force) as tmp:
                write_gap_chart(cap.gap, tmp, label=cap.label)
    data.charts = files
    data.out_dir = str(out_dir)
    write_text(out_dir / REPORT_FILE, render_report(data), force, newline=False)
    write_text(out_dir / DETAILS_FILE, render_details(data), force, newline=False)
    return targets


def check_target(target: Path, out_dir: Path, force: bool, given=()) -> None:
    """One file of the report under the output policy (outputs.py), with the report's own message for --force."""
    if target.exists() and not force and not target.is_dir():
        raise ProfattrError(f"{target} exists; pass --force to overwrite the report in {out_dir}")
    check_output(target, force, given, "the report")
