"""Moved to :mod:`models.store.weights` (building and loading) and :mod:`models.store.result`
(:class:`Snapshot`); this name is kept so that old imports keep working."""

from models.store.result import Snapshot, nonfinite_tensors  # noqa: F401
from models.store.weights import *  # noqa: F401,F403
from models.store.weights import check_state, note_low_precision  # noqa: F401
