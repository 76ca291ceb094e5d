"""Every import points one way: no module of ours reaches itself again through its imports, those
inside functions included (a lazy import hides a circle, it does not remove it). Found by reading
the source (ast), so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "probes", "train", "app", "scratchscope")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (annotations only: never imported at run time)."""
    guarded = [node for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)]
    skipped = {id(n) for node in guarded for child in node.body for n in ast.walk(child)}
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Our modules that `path` imports, anywhere in it (`from a import b` counts a.b when that is a
    module, else a)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules and name != here}
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), written as a path."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                on.discard(w), group.append(w)
            on.discard(v), group.append(v)
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    """probes.entropy -> rows.stats -> rows.qk -> heads -> entropy (heads' previous-token and
    first-position rows now sit below them in probes.rows.head_types) and app.views.lens <-> tuned (the
    grid's rows in app.views.lens_cells) and train.monitor <-> monitor_hf / records (the Monitor now
    lives in train.monitor_core, which both import; trim_metrics in models.store.run) were circles."""
    graph = import_graph()
    assert graph["probes.entropy"] and graph["app.views.lens"] and graph["train.monitor"]  # the graph is read
    assert cycles(graph) == []
