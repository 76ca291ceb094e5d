"""scratchscope's names for training scripts: `from scratchscope import Monitor`.

scratchscope's code lives in the top-level packages `models`, `probes` and `train`, names that a
training project often uses too, and Python puts the script's folder first on sys.path:

- a script called train.py (nanoGPT's is) runs as `__main__`, and a training script is seldom
  imported as a module, so while no module `train` is imported the name is bound to scratchscope's
  package before the Monitor is handed out;
- a module or package of the user's named `models` or `probes` (a models.py beside the script is the
  commonest file of all), or a `train` module already imported, would be found instead of ours, and
  one of the two would break. Importing the Monitor then stops at once with one line that names the
  user's file and the way out, instead of "No module named 'models.cli'; 'models' is not a package"
  from deep inside.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["HFCallback", "Monitor", "NameClashError"]

ROOT = Path(__file__).resolve().parent.parent  # beside this package, installed or not
PACKAGES = ("models", "probes", "train")


class NameClashError(ImportError):
    """A module of the user's has the name of one of scratchscope's packages (one line)."""


def _ours(path: str) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(ROOT / package) for package in PACKAGES)


def _is_main_script(path: str | None) -> bool:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is not None and main is not None and Path(path).resolve() == Path(main).resolve()


def _where(name: str) -> str | None:
    """The file Python would use for `name` now: the imported module's, else the one it would find."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None) or str(getattr(module, "__path__", [None])[0])
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin or next(iter(spec.submodule_search_locations or []), None)


def _check_names() -> None:
    """NameClashError naming the user's module that takes one of our package names."""
    for name in PACKAGES:
        if name == "train" and "train" not in sys.modules:
            continue  # free (a train.py runs as __main__, and scripts are seldom imported): ours is bound
        where = _where(name)
        if where is None or _ours(where) or (name == "train" and _is_main_script(where)):
            continue
        file = Path(where)
        shown = f"{file.parent.name}/ (a package)" if file.name == "__init__.py" else file.name
        raise NameClashError(
            f"scratchscope: your {shown} in {file.parent.parent if file.name == '__init__.py' else file.parent} "
            f"has the name of scratchscope's own `{name}` package, and Python finds yours first; rename yours "
            f"(for example to my_{name}) and import it by that name: both cannot be imported as `{name}`")


def _bind_train_package() -> None:
    """sys.modules["train"] = scratchscope's train package, unless a package is bound there."""
    if hasattr(sys.modules.get("train"), "__path__"):
        return
    spec = importlib.util.spec_from_file_location("train", ROOT / "train" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "train")])
    if spec is None or spec.loader is None:
        raise ImportError(f"scratchscope's train package is not at {ROOT / 'train'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train"] = module
    spec.loader.exec_module(module)


def __getattr__(name: str) -> Any:
    if name in ("HFCallback", "Monitor"):
        _check_names()
        _bind_train_package()
        from train import monitor
        return getattr(monitor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
