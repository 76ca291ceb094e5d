"""Moved to :mod:`models.store.series`; this name is kept so that old imports keep working."""

from models.store.series import *  # noqa: F401,F403
