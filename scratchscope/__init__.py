"""scratchscope's names for training scripts: `from scratchscope import Monitor`.

scratchscope's code lives in the top-level packages `models`, `probes` and `train`, names that a
training project often uses too, and Python puts the script's folder first on sys.path:

- `train`: the training script is often train.py (nanoGPT's), and the user's code may `import train`.
  The Monitor's modules are loaded while the name `train` is bound to our package, every one it
  imports then or later (MONITOR_MODULES), so that none looks the name up again; then the name goes
  back to whatever held it, and is left free where a train.py of the user's would be found: their
  `import train`, before or after, gets their own module (the script running, when it is train.py,
  is no module to import: there `train` stays ours). A user's `train/` *package* would share
  our modules' names (`train.data`), so it clashes like the two below.
- `models`, `probes`: a module or package of the user's with these names (a models.py beside the
  script is the commonest file of all) would be found instead of ours, and one of the two would
  break. Importing the Monitor stops with one line naming every such file at once and the way out.
  A folder without Python files (a `models/` of checkpoints, no __init__.py) is no module of theirs:
  ours is bound under the name instead.
- the error is one line even where nothing catches it (a script's import: sys.excepthook prints
  it so), and the exception itself for a caller or a notebook.

A file of the user's named scratchscope.py hides this package itself, so none of this runs: Python
says "cannot import name 'Monitor' from 'scratchscope' (/their/scratchscope.py)" (docs/monitor.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["HFCallback", "Monitor", "NameClashError"]

ROOT = Path(__file__).resolve().parent.parent  # beside this package, installed or not
PACKAGES = ("models", "probes", "train")
# every module of our `train` the Monitor imports, at once or later inside a function
# (tests/test_name_clash.py reads them all to check this list)
MONITOR_MODULES = ("train.monitor", "train.monitor.core", "train.monitor.parts", "train.monitor.tap",
                   "train.run_lock", "train.doctor", "train.data", "train.host_copy",
                   "train.monitor.optimizer_kinds", "train.monitor.save", "train.guard", "train.guard.settings",
                   "train.guard.run", "train.guard.stop", "train.guard.monitor", "train.guard.loss_watch",
                   "train.guard.snapshot", "train.guard.kinds", "train.guard.plan", "train.guard.rate",
                   "train.guard.rates", "train.guard.planning", "train.guard.update_probe", "train.guard.attention",
                   "train.guard.ranks", "train.guard.evidence", "train.monitor.opening", "train.monitor.wandb_mirror", "train.monitor.tokenizer",
                   "train.monitor.tiktoken_reader", "train.monitor.disk", "train.monitor.plugins",
                   "train.monitor.recording", "train.values")
NEEDS = {"Monitor": MONITOR_MODULES, "HFCallback": (*MONITOR_MODULES, "train.monitor.hf")}

_bound: dict[str, ModuleType] = {}  # our packages bound by hand (under a data folder's name, or `train`)


class NameClashError(ImportError):
    """Modules of the user's have the names of scratchscope's packages (one line naming them all)."""


def _ours(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(ROOT / package) for package in PACKAGES)


def _located(name: str) -> tuple[Path, str] | None:
    """(where, kind) of what `import name` gives now: the imported module, else what Python would
    import; kind is "module", "package" or "folder" (a namespace package: no __init__.py)."""
    module = sys.modules.get(name)
    if module is not None:
        file, folders = getattr(module, "__file__", None), list(getattr(module, "__path__", None) or [])
    else:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        file = spec.origin if spec.has_location else None
        folders = list(spec.submodule_search_locations or [])
    if file:
        return Path(file), "package" if Path(file).name.startswith("__init__.") else "module"
    return (Path(folders[0]), "folder") if folders else None


def _holds_python(folder: Path) -> bool:
    return any(folder.glob("*.py")) or any(folder.glob("*/__init__.py"))


def _clashes() -> list[tuple[str, Path, str]]:
    """(name, where, kind) of each module of the user's that takes one of our package names."""
    found = []
    for name in PACKAGES:
        located = _located(name)
        if located is None or _ours(located[0]):
            continue
        where, kind = located
        if kind == "folder" and not _holds_python(where):
            continue  # data, not a module: ours is bound under the name
        if name == "train" and kind == "module":
            continue  # a train.py: both live (see _load)
        found.append((name, where, kind))
    return found


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _clash_error(clashes: list[tuple[str, Path, str]]) -> NameClashError:
    """One line naming every clashing module, where it is, and the way out."""
    shown = {"module": "{file}", "package": "{name}/ (a package)",
             "folder": "{name}/ (a folder of Python files without __init__.py)"}
    items, renamed, folders = [], [], []
    for name, where, kind in clashes:
        items.append(shown[kind].format(file=where.name, name=name))
        renamed.append(f"my_{where.name}" if kind == "module" else f"my_{name}/")
        folders.append(where.parent.parent if kind == "package" else where.parent)
    if len(set(folders)) == 1:
        yours = f"{_and(items)} in {folders[0]}"
    else:
        yours = _and([f"{item} in {folder}" for item, folder in zip(items, folders)])
    names = _and([f"`{name}`" for name, _, _ in clashes])
    one = len(clashes) == 1
    return NameClashError(
        f"scratchscope: your {yours} {'has the name' if one else 'have the names'} of scratchscope's own "
        f"{names} package{'' if one else 's'}, and Python finds yours first: rename "
        f"{'it' if one else 'them'} (for example to {_and(renamed)}) and import {'it' if one else 'them'} "
        f"by {'that name' if one else 'those names'}: Python imports one module per name")


def _one_line_if_uncaught() -> None:
    """An uncaught NameClashError (a script's import) prints as its one line, not a traceback."""
    previous = sys.excepthook
    if getattr(previous, "scratchscope_one_line", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: Any) -> None:
        if issubclass(kind, NameClashError):
            sys.stderr.write(f"{kind.__module__}.{kind.__qualname__}: {error}\n")
        else:
            previous(kind, error, traceback)

    hook.scratchscope_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _package(name: str) -> ModuleType:
    """Our package `name`, made once from its folder beside this one, and bound in sys.modules."""
    if name not in _bound:
        spec = importlib.util.spec_from_file_location(name, ROOT / name / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / name)])
        if spec is None or spec.loader is None:
            raise ImportError(f"scratchscope's {name} package is not at {ROOT / name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # no half-made package left under the name
            raise
        _bound[name] = module
    sys.modules[name] = _bound[name]
    return _bound[name]


def _load(modules: tuple[str, ...]) -> None:
    """Import `modules` (ours, under `train.`) with `train` naming our package meanwhile; then
    `train` names what it named before, or, where a train.py of the user's would be found, nothing."""
    for name in ("models", "probes"):  # a data folder has the name: ours is bound, no module of theirs is there
        located = _located(name)
        if located is not None and located[1] == "folder":
            _package(name)
    before = sys.modules.get("train")
    located = _located("train")
    if located is None or not _ours(located[0]):
        _package("train")
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        ours = sys.modules.pop("train", None)
        if before is not None:
            sys.modules["train"] = before
        elif ours is not None and not _users_train_module():
            sys.modules["train"] = ours


def _users_train_module() -> bool:
    """A train.py of the user's would be found for `import train`, other than the script running
    (which `import train` would run again: there ours keeps the name, as it does with none)."""
    found = _located("train")
    if found is None or _ours(found[0]) or found[1] != "module":
        return False
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return main is None or Path(main).resolve() != found[0].resolve()


def __getattr__(name: str) -> Any:
    if name not in NEEDS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    clashes = _clashes()
    if clashes:
        _one_line_if_uncaught()
        raise _clash_error(clashes)
    _load(NEEDS[name])
    value = getattr(sys.modules["train.monitor"], name)
    globals()[name] = value  # asked once
    return value
