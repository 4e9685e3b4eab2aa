"""The per-step x category table of a budget as integer matrices: one row per (device, step) with work, one column
per category, so a long capture's millions of (step, category) cells cost 8 bytes each and no text.

`ns` is the summed op time of the category's ops in the step, `count` their number, `exclusive_ns` its share of the
step's busy time (exclusive.py), `has_exclusive` where the exclusive split gave the cell a value (a category whose
ops there all have zero length gets none). A cell with `count` 0 is a category that did not run in that step.
`frame()` gives the same rows as one row per (device, step, category) that ran (the table notebooks and older code
read); `from_frame` builds the matrices back from such rows (the ledger's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FRAME_COLUMNS = ["device", "step", "category", "ns", "count", "exclusive_ns"]
ROWS_PER_CHUNK = 1 << 16  # (step, category) rows made into Python values at once (ledger rows)


@dataclass
class StepCategories:
    """Per (device, step) row and category column: op time, op count and exclusive time, int64."""

    device: np.ndarray  # per row, sorted by (device, step)
    step: np.ndarray
    categories: list  # column names, in the order rows list their categories
    ns: np.ndarray  # rows x categories
    count: np.ndarray
    exclusive_ns: np.ndarray | None  # None: not recorded (a ledger entry added before exclusive time was stored)
    has_exclusive: np.ndarray | None = None  # bool, rows x categories

    def __len__(self) -> int:
        """The number of (step, category) cells that ran (the rows of frame())."""
        return int(np.count_nonzero(self.count))

    @property
    def columns(self) -> list:
        """The values the table holds (frame()'s value columns)."""
        return ["ns", "count"] + (["exclusive_ns"] if self.exclusive_ns is not None else [])

    def rows_of(self, device: int) -> slice:
        """The rows of one device (contiguous: rows are sorted by device)."""
        lo, hi = np.searchsorted(self.device, [device, device + 1])
        return slice(int(lo), int(hi))

    def table(self, device: int, steps: np.ndarray, value: str = "exclusive_ns") -> np.ndarray:
        """len(steps) x categories matrix of `value` (ns, count or exclusive_ns) of one device, row i for steps[i],
        0 for a step without work."""
        rows = self.rows_of(device)
        values = getattr(self, value)[rows]
        steps = np.asarray(steps, dtype=np.int64)
        out = np.zeros((len(steps), len(self.categories)), dtype=np.int64)
        own = self.step[rows]
        at = np.searchsorted(own, steps)
        known = at < len(own)
        known[known] = own[at[known]] == steps[known]
        out[known] = values[at[known]]
        return out

    def present(self, device: int, exclusive: bool = False) -> np.ndarray:
        """Per column, whether the category ran on the device (with `exclusive`: got exclusive time there)."""
        cells = self.has_exclusive if exclusive else self.count > 0
        return cells[self.rows_of(device)].any(axis=0)

    def device_sums(self, device: int, value: str = "exclusive_ns") -> dict:
        """{category: summed `value` over the device's steps}, every column (0 where it did not run)."""
        total = getattr(self, value)[self.rows_of(device)].sum(axis=0)
        return {name: int(v) for name, v in zip(self.categories, total.tolist())}

    def _cells(self, lo: int = 0, hi: int | None = None):
        """(row, column) of the cells that ran among rows [lo, hi), in row then column order."""
        r, c = np.nonzero(self.count[lo:hi])
        return r + lo, c

    def frame(self) -> pd.DataFrame:
        """device, step, category, ns, count[, exclusive_ns]: one row per (device, step, category) that ran, in row
        order and, within a step, in column order."""
        r, c = self._cells()
        out = {"device": self.device[r], "step": self.step[r],
               "category": np.asarray(self.categories, dtype=object)[c] if len(c) else np.zeros(0, dtype=object),
               "ns": self.ns[r, c], "count": self.count[r, c]}
        if self.exclusive_ns is not None:
            out["exclusive_ns"] = self.exclusive_ns[r, c]
        return pd.DataFrame(out)

    def rows(self, columns: dict, **fixed):
        """The frame()'s rows as dicts of plain Python values, a chunk of steps at a time (never the whole table
        as Python objects); `columns`: value name -> key, `fixed`: keys given the same value in every row."""
        names = np.asarray(self.categories, dtype=object)
        step_rows = max(1, ROWS_PER_CHUNK // max(len(self.categories), 1))
        for lo in range(0, len(self.device), step_rows):
            r, c = self._cells(lo, lo + step_rows)
            values = {"device": self.device[r], "step": self.step[r], "category": names[c]}
            for name in ("ns", "count", "exclusive_ns"):
                if name in columns and getattr(self, name) is not None:
                    values[name] = getattr(self, name)[r, c]
            lists = [values[k].tolist() for k in columns if k in values]
            keys = [columns[k] for k in columns if k in values]
            for row in zip(*lists):
                yield {**fixed, **dict(zip(keys, row))}

    @classmethod
    def from_frame(cls, frame: pd.DataFrame | None) -> "StepCategories | None":
        """The matrices of rows (device, step, category, ns, count[, exclusive_ns]) with one row per cell; columns
        in name order. None for None."""
        if frame is None:
            return None
        pair = (frame["device"].to_numpy(np.int64) << 32) | frame["step"].to_numpy(np.int64)
        row, keys = pd.factorize(pair, sort=True)
        col, names = pd.factorize(frame["category"].to_numpy(), sort=True)
        shape = (len(keys), len(names))

        def matrix(column):
            out = np.zeros(shape, dtype=np.int64)
            out[row, col] = frame[column].to_numpy(np.int64)
            return out

        keys = np.asarray(keys, dtype=np.int64)
        return cls(device=keys >> 32, step=keys & 0xFFFFFFFF, categories=[str(x) for x in names], ns=matrix("ns"),
                   count=matrix("count"), exclusive_ns=matrix("exclusive_ns") if "exclusive_ns" in frame else None)


class CellSums:
    """Sums per (pair id, category id) as windows add them: int64 matrices grown as pairs and categories are met
    (accumulate.StepTotals), so a long capture's cells are never held as rows."""

    GROWTH = 1.5

    def __init__(self, names: tuple = ("ns", "count"), rows: int = 0):
        """`rows`: the pairs expected (a budget's steps: one device's pairs), allocated at once so that growing a
        long capture's matrices (two copies while it lasts) is not needed."""
        self.names = names
        self.cells = {k: np.zeros((max(int(rows), 0), 0), dtype=np.int64) for k in names}

    def _fit(self, rows: int, cols: int) -> None:
        have_rows, have_cols = self.cells[self.names[0]].shape
        if rows <= have_rows and cols <= have_cols:
            return
        new_rows = max(rows, int(have_rows * self.GROWTH)) if rows > have_rows else have_rows
        new_cols = max(cols, have_cols)
        for k, old in self.cells.items():
            grown = np.zeros((new_rows, new_cols), dtype=np.int64)
            grown[:have_rows, :have_cols] = old
            self.cells[k] = grown

    def add(self, row: np.ndarray, col: np.ndarray, values: dict, n_rows: int, n_cols: int) -> None:
        """cells[k][row, col] += values[k]; the (row, col) pairs are distinct (add_ns: wrap-around is an error)."""
        from profattr.attribute.ns_sums import add_ns

        self._fit(n_rows, n_cols)
        width = self.cells[self.names[0]].shape[1]
        at = row * width + col
        for k, v in values.items():
            add_ns(self.cells[k].reshape(-1), at, np.asarray(v, dtype=np.int64))

    def finish(self, order: np.ndarray, columns: np.ndarray, n_cols: int) -> dict:
        """{name: len(order) x n_cols matrix}: row i is pair id order[i], column j gathers the category ids whose
        `columns` value is j (summed: several ids may share a column)."""
        out = {}
        for k in self.names:
            m, self.cells[k] = self.cells[k], None
            dest = np.zeros((len(order), n_cols), dtype=np.int64)
            if len(order):
                rows = m[order]
                for j in range(min(m.shape[1], len(columns))):
                    dest[:, columns[j]] += rows[:, j]
            out[k] = dest
        return out
