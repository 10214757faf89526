"""Moved to :mod:`opttree.loading.machine` (a draft's loading is the runtime's, apart from training).
Importing this path warns and gives that module; it goes in the release ``opttree.loading.moved.REMOVED_IN`` names."""

from ..loading.moved import moved_module

moved_module(__name__, "opttree.loading.machine")
