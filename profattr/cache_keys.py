"""Where profattr's caches live and how a cached entry names its input: standard library only, so that a cache
hit is answered before numpy or pandas is imported.

- Where: $PROFATTR_CACHE/NAME, else $XDG_CACHE_HOME/profattr/NAME, else ~/.cache/profattr/NAME; never beside the
  capture. NAME: `opstore` (a capture's op arrays, trace/cache.py) or `budgets` (budget results,
  attribute/result_cache.py).
- Off: PROFATTR_NO_CACHE=1 (the command line's --no-cache sets it).
- A file's key: its identity (device, inode, size, mtime_ns) and a hash of its first and last MiB, salted with what
  the entry's maker is (its version), so that a changed file, or a changed maker, is a miss.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

HASH_BYTES = 1 << 20


def enabled() -> bool:
    return os.environ.get("PROFATTR_NO_CACHE", "").lower() not in ("1", "true", "yes")


def cache_root(name: str) -> Path:
    """The folder of the cache `name` (not created here)."""
    base = os.environ.get("PROFATTR_CACHE")
    if base:
        return Path(base) / name
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "profattr" / name


def file_key(path, salt: str) -> str:
    """The key of a file's content as an entry made by `salt` sees it: identity, content hash of its ends."""
    path = Path(path)
    st = path.stat()
    h = hashlib.sha256()
    h.update(f"{salt}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode())
    with path.open("rb") as fh:
        h.update(fh.read(HASH_BYTES))
        if st.st_size > HASH_BYTES:
            fh.seek(max(HASH_BYTES, st.st_size - HASH_BYTES))
            h.update(fh.read(HASH_BYTES))
    return h.hexdigest()[:32]


SQLITE_HEAD = b"SQLite format 3\x00"


def current_export(path) -> Path | None:
    """The SQLite export a capture is read from, when it is there now: the file itself when it is one, or a
    .nsys-rep's export beside it that is not older than it (trace/reader.py resolve_capture); else None."""
    path = Path(path)
    try:
        if path.suffix in (".nsys-rep", ".qdrep"):
            beside = path.with_suffix(".sqlite")
            return beside if beside.is_file() and beside.stat().st_mtime >= path.stat().st_mtime else None
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            return path if fh.read(len(SQLITE_HEAD)) == SQLITE_HEAD else None
    except OSError:
        return None  # the reader says what is wrong with it
