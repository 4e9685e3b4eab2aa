"""PNG waterfall chart of a `profattr.gap/1` dict (matplotlib, Agg backend): floor -> components -> measured."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

MAX_DEVICES = 8  # one panel per device; more would be unreadable


def write_gap_chart(gap: Dict[str, Any], path: Path, label: Optional[str] = None) -> Path:
    """Write the waterfall chart to `path` (PNG) and return the path. `label`: the capture's label, as the report's
    tables name it, put before each panel's title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = gap["devices"][:MAX_DEVICES]
    height = max(3.0, 0.35 * max((len(d["components"]) + 2 for d in devices), default=3))
    fig, axes = plt.subplots(len(devices) or 1, 1, figsize=(10, height * max(len(devices), 1)), squeeze=False)
    for ax, dev in zip(axes[:, 0], devices):
        labels, lefts, widths, colors = ["floor"], [0.0], [dev["floor_ms"]], ["#4472c4"]
        running = dev["floor_ms"]
        for comp in dev["components"]:
            labels.append(str(comp["component"]).replace("$", r"\$"))  # no mathtext from capture strings
            lefts.append(running if comp["ms"] >= 0 else running + comp["ms"])
            widths.append(abs(comp["ms"]))
            colors.append("#c0504d" if comp["ms"] >= 0 else "#9bbb59")
            running += comp["ms"]
        labels.append("measured step")
        lefts.append(0.0)
        widths.append(dev["measured_step_ms"])
        colors.append("#7f7f7f")
        y = list(range(len(labels)))[::-1]
        ax.barh(y, widths, left=lefts, color=colors)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlabel("ms per step (floor, then each category above its floor, overlap, idle)")
        name = str(label).replace("$", "\\$") if label else None  # no mathtext from capture strings
        who = (name if len(devices) == 1 else f"{name} / GPU {dev['device']}") if name else f"device {dev['device']}"
        ax.set_title(f"{who}: floor {dev['floor_ms']:.3f} ms -> measured "
                     f"{dev['measured_step_ms']:.3f} ms", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path
