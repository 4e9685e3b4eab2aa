"""Build small SQLite files with the real nsys 2023.4.4 table layout, for edge cases and bad input only.

Headline numbers in tests come from real captures; these files exercise what real captures rarely show (nested
and cross-thread ranges, missing tables, multi-process correlation ids, old metadata table names).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = Path(__file__).parent / "data" / "nsys_2023.4.4_schema.sql"
PID_SHIFT = 24


def gtid(pid: int, tid: int | None = None, vm: int = 1) -> int:
    """A serialized globalTid (vm id in bits 48..55, pid in 24..47, tid in 0..23)."""
    return (vm << 48) | (pid << PID_SHIFT) | (tid if tid is not None else pid)


def gpid(pid: int, vm: int = 1) -> int:
    return (vm << 48) | (pid << PID_SHIFT)


class Builder:
    def __init__(self, path, tables=None, meta_table="META_DATA_EXPORT"):
        self.path = Path(path)
        self.conn = sqlite3.connect(self.path)
        statements = SCHEMA.read_text().split(";\n")
        for stmt in statements:
            stmt = "\n".join(line for line in stmt.splitlines() if not line.startswith("--")).strip()
            if not stmt:
                continue
            name = stmt.split("(")[0].split()[-1]
            if tables is None or name in tables or name in ("StringIds", "META_DATA_EXPORT"):
                if name == "META_DATA_EXPORT" and meta_table != "META_DATA_EXPORT":
                    stmt = stmt.replace("META_DATA_EXPORT", meta_table)
                self.conn.execute(stmt)
        self.meta_table = meta_table
        self.conn.executemany(f"INSERT INTO {meta_table} VALUES (?, ?)",
                              [("EXPORT_PRODUCT_VERSION", "2023.4.4.54"), ("EXPORT_SCHEMA_VERSION", "3.7.2")])
        self._strings: dict = {}
        self._corr = 0

    def string(self, value: str) -> int:
        if value not in self._strings:
            sid = len(self._strings) + 1
            self._strings[value] = sid
            self.conn.execute("INSERT INTO StringIds VALUES (?, ?)", (sid, value))
        return self._strings[value]

    def launch(self, tid_g: int, start: int, end: int, name: str = "cudaLaunchKernel_v7000", corr=None) -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
                          "correlationId, nameId, returnValue) VALUES (?,?,?,?,?,?,0)",
                          (start, end, 0, tid_g, corr, self.string(name)))
        return corr

    def kernel(self, pid_g: int, corr: int, start: int, end: int, name: str, demangled: str | None = None,
               device: int = 0, stream: int = 7, graph_node=None) -> None:
        self.conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
            "globalPid, demangledName, shortName, launchType, cacheConfig, registersPerThread, gridX, gridY, gridZ, "
            "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
            "localMemoryTotal, gridId, sharedMemoryExecuted, graphNodeId, sharedMemoryLimitConfig) "
            "VALUES (?,?,?,1,?,?,?,?,?,1,0,32,1,1,1,128,1,1,0,0,0,0,?,0,?,0)",
            (start, end, device, stream, corr, pid_g, self.string(demangled or name), self.string(name), corr,
             graph_node))

    def memcpy(self, pid_g: int, corr: int, start: int, end: int, copy_kind: int = 8, nbytes: int = 1024,
               device: int = 0) -> None:
        self.conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, "
            "globalPid, bytes, copyKind, srcKind, dstKind) VALUES (?,?,?,1,7,?,?,?,?,2,2)",
            (start, end, device, corr, pid_g, nbytes, copy_kind))

    def nvtx(self, tid_g: int, start: int, end, text: str, event_type: int = 59, registered: bool = False,
             domain: int = 0, end_tid=None) -> None:
        text_col, text_id = (None, self.string(text)) if registered else (text, None)
        self.conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid, "
                          "textId, domainId) VALUES (?,?,?,?,?,?,?,?)",
                          (start, end, event_type, text_col, tid_g, end_tid, text_id, domain))

    def graph_node(self, tid_g: int, start: int, node: int, original=None) -> None:
        self.conn.execute("INSERT INTO CUDA_GRAPH_EVENTS (start, end, eventClass, globalTid, nameId, graphNodeId, "
                          "originalGraphNodeId) VALUES (?,?,77,?,?,?,?)",
                          (start, start + 10, tid_g, self.string("node"), node, original))

    def close(self) -> Path:
        self.conn.commit()
        self.conn.close()
        return self.path
