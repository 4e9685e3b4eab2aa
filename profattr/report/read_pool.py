"""A report's captures read in worker processes, a process per core: first the op stores the cache lacks are built
(trace/cache.py), each capture's read is started as soon as its store is there, so that store builds and reads share
the cores instead of a read waiting for every build. On two cores, three captures take about half of the time one
after another would.

Workers are forked (Linux), so they start with the modules this process has already imported and nothing is
imported or pickled again but the read's result. A worker says nothing itself: the warnings of a read come back with
it and are said here, in the captures' order (errors.warn: each once). A worker never raises: a read that fails
there comes back as None and is read again in this process, where it meets its error as a read here would (one
clear line, the same exit).
Nothing runs in workers with one core, the cache off and nothing to read in parallel, or where processes cannot be
forked (`PROFATTR_READ_WORKERS=1` turns them off).
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from profattr import cores, errors, progress
from profattr.trace import cache


def read_in_workers(jobs: list, also_stored, read) -> list:
    """`read(job)` of each job (a ReadJob: its `path` is read) in worker processes, in order, its warnings said
    here; None for a job that was not read there (the caller reads it). `also_stored`: more captures whose op
    stores are built beside."""
    context = _fork_context()
    if context is None:
        return [None] * len(jobs)
    exports = {}  # the exports whose op store the cache lacks, each once (none with --force: exported again first)
    for path in [] if any(job.force for job in jobs) else [job.path for job in jobs] + [str(p) for p in also_stored]:
        export = cache.unstored_export(path)
        if export is not None:
            exports.setdefault(_same_file(export, exports), export)
    needs = [_needs(job.path, exports) for job in jobs]
    if len(jobs) < 2 and len(exports) < 2:  # nothing that can run beside anything else
        return [None] * len(jobs)
    workers = cores.threads("PROFATTR_READ_WORKERS", len(jobs) + len(exports))
    if workers < 2:
        return [None] * len(jobs)
    try:
        with progress.stage(f"reading {len(jobs)} capture(s)"):
            with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_start_worker) as pool:
                done = _run(pool, jobs, needs, exports, read)
    except (OSError, BrokenProcessPool):  # a worker died (out of memory, killed): what is left is read here
        return [None] * len(jobs)
    for value, said in done:
        if value is not None:  # a failed read is read again here, and says its warnings then
            for line in said:
                errors.warn(line)
    return [value for value, _ in done]


def _run(pool, jobs: list, needs: list, exports: dict, read) -> list:
    """Builds first (in the pool's queue order), each read submitted once the builds it needs are done."""
    built = {key: pool.submit(cache.build_store, export) for key, export in exports.items()}
    reads: dict = {}
    waiting = set(range(len(jobs)))
    while waiting:
        for i in sorted(waiting):
            if all(built[key].done() for key in needs[i]):
                reads[i] = pool.submit(_read_or_none, read, jobs[i])
                waiting.discard(i)
        if waiting:
            wait([f for f in built.values() if not f.done()], return_when=FIRST_COMPLETED)
    return [reads[i].result() for i in range(len(jobs))]


def _start_worker() -> None:
    """A worker's warnings are recorded (_read_or_none), not said: the parent says them."""
    cache.quiet()
    errors.warnings_to_stderr(False)
    warnings.simplefilter("ignore", errors.ProfattrWarning)


def _read_or_none(read, job) -> tuple:
    """(read(job) or None where it failed, the warnings it gave)."""
    with errors.recorded_warnings() as said:
        try:
            value = read(job)
        except Exception:  # noqa: BLE001 (read again by the parent, which meets the error itself)
            value = None
    return value, list(said)


def _fork_context():
    """The fork start method on Linux (workers share this process's imports), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return multiprocessing.get_context("fork")
    except ValueError:
        return None


def _same_file(export, exports: dict) -> str:
    """The key of `export` among `exports`: an existing key naming the same file, else its own path."""
    for key, other in exports.items():
        try:
            if os.path.samefile(export, other):
                return key
        except OSError:
            continue
    return str(export)


def _needs(path, exports: dict) -> list:
    """The keys of `exports` whose store the read of `path` needs (its own export's, when the cache lacks it)."""
    export = cache.unstored_export(path)
    return [] if export is None else [_same_file(export, exports)]
