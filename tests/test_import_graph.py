"""Every import points one way: no module of ours reaches itself again through its imports, those
inside functions included (a lazy import hides a circle, it does not remove it). Found by reading
the source (ast), so nothing is imported. Imports under `if TYPE_CHECKING:` are not counted (never
run); an edge goes to the module named, not its parent packages (a parent package is always
initialised first: that is no circle). The benchmarks are scripts that put benchmarks/ on sys.path
and import each other by file name (`from guard_cases import ...`), and some of tests/' kits the
same way (`gpt_kit`): those are nodes by their file name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "probes", "train", "app", "scratchscope")
SCRIPTS = "benchmarks"  # files imported by their stem, as top-level modules
KITS = "tests"  # their stems too, where a script imports one


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, but those in the body of `if TYPE_CHECKING:` (its
    `else:` runs, so it counts)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        children = node.orelse if isinstance(node, ast.If) and type_checking_only(node) else ast.iter_child_nodes(node)
        todo.extend(children)
    return found


def imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ours one import statement names: `import a.b` -> a.b; `from a.b import c` ->
    a.b.c where that is a module, else a.b; relative imports from `here`'s package."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = here.split(".") if is_package else here.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:  # `import a.b.c` where c is a name: the longest module of ours
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES, scripts: str | None = SCRIPTS,
                 kits: str | None = KITS) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports at run time."""
    files = {module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")}
    flat = {}  # stems importable as top-level modules: the scripts', and kits' where a script imports one
    for folder in (kits, scripts):  # a script's own file wins over a kit of the same name
        if folder and (root / folder).is_dir():
            flat |= {p.stem: p for p in (root / folder).glob("*.py")}
    modules = set(files) | set(flat)
    if scripts:
        files |= {p.stem: p for p in (root / scripts).glob("*.py")}
    graph: dict[str, set[str]] = {}
    todo = list(files)
    while todo:
        name = todo.pop()
        if name in graph:
            continue
        path = files.get(name) or flat[name]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        graph[name] = {m for node in runtime_imports(tree) for m in imported(node, name, is_package, modules)} - {name}
        todo += [m for m in graph[name] if m not in graph]  # a kit a script imports is read too
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's groups of two or more modules that reach each other, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start), on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def circle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, within the group."""
    first, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [first, *reversed(path[:-1]), first] if len(path) > 1 else [first, v, first]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no circle through {group}")  # a strongly connected group always has one


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Each circle found, readable: `a -> b -> a` (and the group's other modules, where it has more)."""
    lines = []
    for group in strongly_connected(graph):
        path = circle_through(group, graph)
        rest = sorted(set(group) - set(path))
        lines.append(" -> ".join(path) + (f" (with {', '.join(rest)} in the same circle)" if rest else ""))
    return lines


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    root = write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f():\n    from pkg import b\n",
                            "pkg/b.py": "import pkg.a\n", "pkg/c.py": "from . import a\n"})
    graph = import_graph(root, ("pkg",), None, None)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == {"pkg.a"}  # `from pkg import b`: the module b
    assert circles(graph) == ["pkg.a -> pkg.b -> pkg.a"]


def test_the_checker_skips_type_checking_imports_and_parent_packages(tmp_path):
    root = write(tmp_path, {"pkg/__init__.py": "from pkg.a import X\n",
                            "pkg/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.b import Y\nX = 1\n",
                            "pkg/b.py": "from typing import TYPE_CHECKING\nfrom pkg.a import X\n"
                                        "if TYPE_CHECKING:\n    pass\nelse:\n    import pkg.sub.c\n",
                            "pkg/sub/__init__.py": "", "pkg/sub/c.py": "from pkg import a\n"})
    graph = import_graph(root, ("pkg",), None, None)
    assert graph["pkg.a"] == set() and graph["pkg.b"] == {"pkg.a", "pkg.sub.c"}  # an `else:` runs: counted
    assert graph["pkg.sub.c"] == {"pkg.a"} and circles(graph) == []  # pkg and pkg.sub imported first: no circle


def test_the_checker_reads_scripts_by_their_file_name(tmp_path):
    root = write(tmp_path, {"pkg/__init__.py": "", "bench/one.py": "import two\nimport pkg\n",
                            "bench/two.py": "def f():\n    from kit import k\n", "kits/kit.py": "import one\n",
                            "kits/unused.py": "import one\n"})
    graph = import_graph(root, ("pkg",), "bench", "kits")
    assert graph["one"] == {"two", "pkg"} and "unused" not in graph  # a kit no script imports is not read
    assert circles(graph) == ["kit -> one -> two -> kit"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}}) == ["a -> b -> c -> a"]


def test_no_module_imports_itself_through_others():
    """Circles broken so far: probes.entropy -> rows.stats -> rows.qk -> heads -> entropy (the rows
    in probes.rows.head_types), app.views.lens <-> tuned (app.views.lens_cells), train.monitor <->
    monitor_hf / records (the Monitor in train.monitor.core), the guard <-> the Monitor (the guard
    plugs in through train.monitor.plugins; train.values below both), the guard's run <-> its
    settings, planning and rates (train.guard.evidence)."""
    graph = import_graph()
    assert graph["probes.entropy"] and graph["app.views.lens"] and graph["train.monitor"]  # the graph is read
    assert graph["bench_guard"] and graph["train.monitor.core"]
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(found)
