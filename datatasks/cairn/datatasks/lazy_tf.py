"""`tf`: TensorFlow, imported on first use.

Modules of `cairn.datatasks` write `from cairn.datatasks.lazy_tf import tf` instead of
`import tensorflow as tf`, so that importing the library, registering tasks and reading a
cache through the NumPy path of the deterministic reader never import TensorFlow (~7 s and
~700 MB). The first attribute read (`tf.data`, `tf.string`, ...) imports it; later reads
are plain module attribute lookups.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any


class LazyModule(types.ModuleType):
    """A stand-in for module `name` that imports it when an attribute is first read."""

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)


if TYPE_CHECKING:
    import tensorflow as tf
else:
    tf = LazyModule("tensorflow")

__all__ = ["LazyModule", "tf"]
