"""scratchscope's names for training scripts: `from scratchscope import Monitor`.

A training script is often itself called train.py (nanoGPT's is), and Python puts the script's
folder first on sys.path, so there `import train` finds the script, not scratchscope's `train`
package: `from train.monitor import Monitor` fails with "'train' is not a package". Importing
through this module binds the name `train` to scratchscope's package first (the script itself
runs as `__main__`, so nothing of the user's is replaced), then hands out the Monitor.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["HFCallback", "Monitor"]

TRAIN_PACKAGE = Path(__file__).resolve().parent.parent / "train"  # beside this one, installed or not


def _bind_train_package() -> None:
    """sys.modules["train"] = scratchscope's train package, unless a package is bound there."""
    if hasattr(sys.modules.get("train"), "__path__"):
        return
    spec = importlib.util.spec_from_file_location("train", TRAIN_PACKAGE / "__init__.py",
                                                  submodule_search_locations=[str(TRAIN_PACKAGE)])
    if spec is None or spec.loader is None:
        raise ImportError(f"scratchscope's train package is not at {TRAIN_PACKAGE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train"] = module
    spec.loader.exec_module(module)


def __getattr__(name: str) -> Any:
    if name in __all__:
        _bind_train_package()
        from train import monitor
        return getattr(monitor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
