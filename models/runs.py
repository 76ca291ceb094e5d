"""Moved to :mod:`models.store.run` (run directories) and :mod:`models.store.files` (durable
writes); this name is kept so that old imports keep working."""

from models.store.files import *  # noqa: F401,F403
from models.store.files import CheckpointError, current_umask, dumps_json, read_json_object  # noqa: F401
from models.store.run import *  # noqa: F401,F403
from models.store.run import SNAPSHOT_CONFIG, checkpoint_files  # noqa: F401
