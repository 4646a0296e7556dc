"""Import-time stand-ins for a framework's optional dependencies that the writer code under test
never calls (monitoring, web servers...): every attribute is a MagicMock. Used by the generator
scripts of this folder, run as scripts (this folder is then on ``sys.path``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types
from unittest import mock


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sys.meta_path.append(StubFinder(["wandb"]))`` makes ``import wandb`` (and submodules) a stub."""

    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
        return m

    def exec_module(self, module):
        pass
