"""Loaded by verl in every process when ``VERL_USE_EXTERNAL_MODULES=gfcr.integrations.verl_plugin``.

It patches ``RayPPOTrainer`` (see :func:`gfcr.integrations.verl.install_hook`) as soon as, and only
if, a process imports ``verl.trainer.ppo.ray_trainer`` (the Ray TaskRunner that runs ``fit``), so
processes that never import the trainer (rollout and reward workers) pay nothing. Importing the
trainer module from here directly would be too early: verl imports this module from its own
``__init__``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

TARGET = "verl.trainer.ppo.ray_trainer"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` through the other finders and runs the hook after its module executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader = spec.loader
                run = loader.exec_module

                def exec_module(module: Any, _run: Any = run) -> None:
                    _run(module)
                    from gfcr.integrations.verl import install_hook

                    install_hook(module.RayPPOTrainer)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def enable() -> None:
    """Patch now if the trainer module is loaded, else when it gets imported. Idempotent."""
    mod = sys.modules.get(TARGET)
    if mod is not None and hasattr(mod, "RayPPOTrainer"):
        from gfcr.integrations.verl import install_hook

        install_hook(mod.RayPPOTrainer)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


enable()
