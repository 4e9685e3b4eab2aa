"""The stages hold: every import inside profattr/ (module-level and inside functions, read from the AST) goes down
the layers, and no two modules import each other, directly or round a circle.

Layers, top to bottom (a module may import its own package and any lower layer):
  cli, api and every Click module (NAME/commands.py, NAME/*_commands.py): the thin command layer
  -> report -> capture, ledger, limits -> check -> attribute -> taxonomy -> trace
  -> outputs -> run_record, tools, regexguard, workloads, engines -> inputs, cache_keys -> progress -> errors
  -> text, arrays, cores
The package root (`from profattr import __version__`) is importable from anywhere.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "profattr"

LAYERS = [("commands", "api"), ("report",), ("capture", "ledger", "limits"), ("check",), ("attribute",),
          ("taxonomy",), ("trace",), ("outputs",), ("run_record", "tools", "regexguard", "workloads", "engines"),
          ("inputs", "cache_keys"), ("progress",), ("errors",), ("text", "arrays", "cores")]
RANK = {group: rank for rank, groups in enumerate(LAYERS) for group in groups}

# Known violations, each with why it is still there; a new one fails. Remove an entry when its import goes.
ALLOWED_UPWARD: set = set()
ALLOWED_CYCLES: list = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set:
    """The profattr modules `name` imports anywhere in its file (`from X import Y` counts X.Y when Y is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                out.add(f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module)
    return {m for m in out if m in MODULES and m not in (name, "profattr")}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items() if name != "profattr"}


def group_of(module: str) -> str:
    parts = module.split(".")
    leaf = parts[-1]
    if leaf in ("cli", "__main__", "commands") or leaf.endswith("_commands"):
        return "commands"
    return parts[1]


def upward_imports(graph: dict = GRAPH) -> set:
    out = set()
    for a, targets in graph.items():
        for b in targets:
            ga, gb = group_of(a), group_of(b)
            if ga == gb:
                continue
            if RANK[gb] <= RANK[ga]:
                out.add((a, b))
    return out


def cycles(graph: dict = GRAPH) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_every_package_has_a_layer():
    assert {group_of(m) for m in GRAPH} <= set(RANK), {group_of(m) for m in GRAPH} - set(RANK)


def test_the_scan_sees_function_level_imports():
    # budget.py imports windows.py inside a function only; report.commands imports write_report at module level
    assert "profattr.attribute.windows" in GRAPH["profattr.attribute.budget"]
    assert "profattr.report.write" in GRAPH["profattr.report.commands"]
    assert "profattr.report.md_table" in GRAPH["profattr.report.campaign"]  # relative or absolute alike


def test_imports_go_down_the_layers():
    new = sorted(upward_imports() - ALLOWED_UPWARD)
    assert not new, "imports against the layers: " + ", ".join(f"{a} -> {b}" for a, b in new)


def test_the_allow_list_is_current():
    gone = ALLOWED_UPWARD - upward_imports()
    assert not gone, f"fixed, remove from ALLOWED_UPWARD: {sorted(gone)}"
    assert sorted(map(sorted, cycles())) == sorted(map(sorted, ALLOWED_CYCLES))


def test_no_new_import_cycles():
    new = [c for c in cycles() if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not new, "modules that import each other: " + "; ".join(" <-> ".join(sorted(c)) for c in new)


def test_a_new_upward_import_or_circle_is_caught():
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["profattr.text"].add("profattr.report.markdown")  # the lowest layer reaching the report
    assert ("profattr.text", "profattr.report.markdown") in upward_imports(graph)
    graph["profattr.trace.nsys_sqlite"].add("profattr.trace.reader")  # reader imports nsys_sqlite
    assert any({"profattr.trace.nsys_sqlite", "profattr.trace.reader"} <= c for c in cycles(graph))
