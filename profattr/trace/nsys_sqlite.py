"""The low end of reading an nsys SQLite export: its table names, the SQL of queries/, the error for values an integer
column cannot hold, and the interface (NsysTables) that the table readers (nsys_tables.py, nsys_samples.py,
graph_replays.py, nsys_graphs.py) use on an open export. reader.Export opens the file and implements NsysTables;
the table readers import only this module, so the reader and its table readers import in one direction."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from profattr.errors import ProfattrError

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
QUERIES_DIR = Path(__file__).resolve().parent.parent / "queries"


def load_query(name: str, **fragments: str) -> str:
    """The SQL text of `queries/<name>.sql`, with `{fragment}` placeholders filled (for optional columns)."""
    path = QUERIES_DIR / f"{name}.sql"
    text = path.read_text()
    return text.format(**fragments) if fragments else text


class DamagedValues(ProfattrError):
    """A query met a value its integer columns cannot hold (NULL, text, a number beyond 64 bits)."""


class NsysTables(Protocol):
    """What the table readers use of an open export (reader.Export): its path, which tables and columns it has, and
    SQL run into rows or int64 arrays; `claims` (validate.Claims) records what the arrays were checked for."""

    path: Path
    claims: object

    def has(self, table: str) -> bool: ...

    def columns(self, table: str) -> set: ...

    def column_or(self, table: str, column: str, alias: str, default: str = "NULL") -> str: ...

    def count(self, table: str) -> int: ...

    def query(self, sql: str, params: Sequence = ()) -> list: ...

    def arrays(self, sql: str, names: Sequence[str], params: Sequence = (), max_rows: int | None = None) -> dict: ...

    def arrays_into(self, sql: str, buf: np.ndarray, offset: int, params: Sequence = ()) -> int: ...
