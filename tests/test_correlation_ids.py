"""The records check's figures (check/correlation_ids.py): each process's distinct correlation ids kept as a bitmap
(or, too sparse for one, as ids), added a block of keys at a time in any order; against sorted sets and medians
written here, and against SQL on real captures."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES
from profattr.check import correlation_ids as C
from profattr.check.correlation_ids import BIG_GAP_FACTOR, BIG_GAP_IDS, CorrelationIds, correlation_gaps


def _plain(keys: list) -> dict:
    """The figures from Python sets and np.median, process by process."""
    want = {"processes": 0, "largest_gap": 0, "usual_gap": 0, "big_gaps": 0, "ids_in_big_gaps": 0, "span": 0}
    for p in sorted({k >> 32 for k in keys}):
        ids = sorted({k & 0xFFFFFFFF for k in keys if k >> 32 == p})
        if len(ids) < 3:
            continue
        gaps = [b - a for a, b in zip(ids, ids[1:])]
        usual = max(int(np.median(gaps)), 1)
        big = [g for g in gaps if g > max(BIG_GAP_IDS, BIG_GAP_FACTOR * usual)]
        want["processes"] += 1
        want["largest_gap"] = max(want["largest_gap"], max(gaps))
        want["usual_gap"] = max(want["usual_gap"], usual)
        want["big_gaps"] += len(big)
        want["ids_in_big_gaps"] += sum(big)
        want["span"] += ids[-1] - ids[0]
    return want


def _blocks(keys: list, rng, most: int) -> list:
    cut = np.sort(rng.integers(0, len(keys) + 1, size=int(rng.integers(0, most))))
    return np.split(np.array(keys, dtype=np.int64), cut)


@pytest.mark.parametrize("seed", range(8))
def test_sparse_ids_of_several_processes_against_plain_python(seed):
    """Ids anywhere in 32 bits (a process too sparse for a bitmap keeps its ids), repeats, processes up to the top
    of the key's range (negative keys), blocks in any order and of any size."""
    rng = np.random.default_rng(seed)
    procs = rng.choice([0, 5, 77, 2**31 - 1, 2**32 - 1], size=int(rng.integers(1, 5)), replace=False).tolist()
    keys = []
    for p in procs:
        ids = rng.integers(0, 2**32 - 1, int(rng.integers(0, 200))).tolist() + [1, 2, 2]
        keys += [(p << 32) | i for i in ids]
    rng.shuffle(keys)
    signed = [k - (1 << 64) if k >= 1 << 63 else k for k in keys]  # as int64 holds them
    acc = CorrelationIds()
    for block in _blocks(signed, rng, 6):
        acc.add(block)
    assert acc.result() == _plain(keys)
    assert correlation_gaps(np.array(signed, dtype=np.int64)) == _plain(keys)


@pytest.mark.parametrize("seed", range(8))
def test_dense_ids_in_a_bitmap_against_plain_python(seed, monkeypatch):
    """Dense runs of ids with dropped stretches (big gaps), ids rising block by block but out of order inside and
    across blocks, the bitmap grown up and down many times (small parts read back at a time)."""
    monkeypatch.setattr(C, "SCAN_BYTES", 7)
    rng = np.random.default_rng(100 + seed)
    keys = []
    for p in rng.choice([3, 9, 1 << 20], size=int(rng.integers(1, 4)), replace=False).tolist():
        steps = rng.choice([1, 2, 3, 40_000], p=[0.6, 0.3, 0.0995, 0.0005], size=int(rng.integers(3, 5000)))
        steps[int(rng.integers(0, len(steps)))] = 40_000  # at least one big gap
        ids = np.cumsum(steps) + int(rng.integers(0, 1 << 30))
        keys += [(p << 32) | int(i) for i in ids]
    order = np.argsort(np.arange(len(keys)) + rng.normal(0, 50, len(keys)))  # nearly in order
    keys = [keys[i] for i in order] + keys[: len(keys) // 10]  # repeats
    acc = CorrelationIds()
    for block in _blocks(keys, rng, 40):
        acc.add(block)
    assert acc.result() == _plain(keys)
    assert all(ids.listed is None for ids in acc.processes.values())  # dense: bitmaps


def test_a_bitmap_turned_into_ids_keeps_what_it_held(monkeypatch):
    monkeypatch.setattr(C, "MIN_BITMAP_IDS", 64)
    keys = [(4 << 32) | i for i in (10, 11, 12, 20)] + [(4 << 32) | 5_000_000, (4 << 32) | 13]
    acc = CorrelationIds().add(np.array(keys[:4])).add(np.array(keys[4:]))
    assert acc.processes[4].listed is not None
    assert acc.result() == _plain(keys)


def test_the_records_check_of_real_captures_against_sql():
    """completeness.check_records through the export's fold_api_keys, against the figures of the keys SQL gives."""
    import sqlite3

    from profattr.check.completeness import check_records
    from profattr.trace.reader import open_export

    for name in ("sglang-triton-bs1", "glm5/glm-triton-bs1-r1"):
        path = EXAMPLES / f"{name}.sqlite"
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        keys = [((t >> 24) & 0xFFFFFFFF) << 32 | c for t, c in conn.execute(
            "SELECT globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")]
        conn.close()
        with open_export(path) as export:
            finding = check_records(export)
        want = _plain(keys)
        assert want["processes"] >= 1
        assert {k: finding.data[k] for k in want} == want
