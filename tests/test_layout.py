"""The tree shows the architecture (docs/ARCHITECTURE.md): no import cycles, a package root that holds
only the public surface and the generation loop, and a C core whose folders each hold one role."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llambda"
CSRC = ROOT / "csrc"

ROOT_MODULES = {"__init__", "__main__", "api", "engine", "sampling", "speculative", "thinking", "errors", "finite", "cli",
                "repl", "chat", "hub", "switches"}


def _python_modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its body (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rsplit(".", 1)[0]
            mod = node.module if not node.level else (f"{base}.{node.module}" if node.module else base)
            for alias in node.names:
                out.add(f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in mods else mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    # a package's own __init__ is not an edge of its submodules
    return {m for m in out if m in mods and m != name and not name.startswith(m + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_python_import_cycles():
    mods = _python_modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert graph["llambda.api"] >= {"llambda.engine", "llambda.formats.open"}     # the walk sees imports
    assert _cycles(graph) == []


def test_package_root_holds_only_the_public_surface():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == ROOT_MODULES, "a new root module: does it belong in a sub-package?"


def _includes(path: Path) -> set[str]:
    return set(re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(encoding="utf-8"), re.M))


def test_no_c_include_cycles():
    files = [p for p in CSRC.rglob("*") if p.suffix in (".c", ".h", ".inc")]
    by_rel = {str(p.relative_to(CSRC)): p for p in files}

    def resolve(src: Path, inc: str) -> str | None:
        for cand in (src.parent / inc, CSRC / inc):
            rel = str(cand.resolve().relative_to(CSRC.resolve())) if cand.exists() else None
            if rel in by_rel:
                return rel
        return None

    graph = {rel: {r for r in (resolve(p, i) for i in _includes(p)) if r} for rel, p in by_rel.items()}
    assert _cycles(graph) == []


# csrc/: one folder per role, and the rooms a folder's files may include from (dependencies go one way)
C_ROOMS = {
    "core": {"core"},
    "quants": {"quants", "core"},
    "ops": {"ops", "core"},
    "matmul": {"matmul", "quants", "core"},
    "moe": {"moe", "matmul", "ops", "quants", "core"},
    "python": {"python", "moe", "matmul", "ops", "quants", "core"},
}


def test_c_core_has_one_folder_per_role_and_one_way_includes():
    assert not [p.name for p in CSRC.iterdir() if p.is_file()], "every C file lives in its role's folder"
    assert {p.name for p in CSRC.iterdir() if p.is_dir()} == set(C_ROOMS)
    for p in CSRC.rglob("*"):
        if p.suffix not in (".c", ".h", ".inc"):
            continue
        room = p.relative_to(CSRC).parts[0]
        for inc in _includes(p):
            target = (p.parent / inc) if (p.parent / inc).exists() else CSRC / inc
            assert target.exists(), f"{p}: {inc} not found"
            used = target.resolve().relative_to(CSRC.resolve()).parts[0]
            assert used in C_ROOMS[room], f"{p.relative_to(CSRC)} ({room}) includes {inc} ({used})"
