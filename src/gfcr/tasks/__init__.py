"""Task sources: where prompts come from. Each produces :class:`gfcr.records.Prompt` s.

A task source has a ``name`` and ``prompts()``; each prompt carries its messages, the gold answer
(``answer``) or code tests (``tests``), ``category``, ``difficulty`` and ``split``.

===================  ===========================================================================
name                 source
===================  ===========================================================================
``arith``            :func:`gfcr.tasks.arith.make_arith`: procedural arithmetic (own generator)
``reasoning_gym``    :func:`gfcr.tasks.rgym.make_reasoning_gym`: any reasoning-gym dataset
``jsonl_math``       :func:`gfcr.tasks.jsonl.load_math_jsonl`: GSM8K-style question/answer lines
``jsonl_code``       :func:`gfcr.tasks.jsonl.load_code_jsonl`: prompt + tests lines
===================  ===========================================================================
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from gfcr.records import Prompt


@runtime_checkable
class TaskSource(Protocol):
    """A named source of prompts."""

    name: str

    def prompts(self) -> list[Prompt]: ...


class PoolTooSmall(ValueError):
    """A task source holds fewer distinct prompts than asked for; ``prompts`` are all it has."""

    def __init__(self, message: str, prompts: list[Prompt]):
        super().__init__(message)
        self.prompts = prompts


class ListSource:
    """A task source over a fixed list of prompts (what every built-in factory returns)."""

    def __init__(self, name: str, prompts: list[Prompt]):
        self.name = name
        self._prompts = list(prompts)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def __len__(self) -> int:
        return len(self._prompts)


SOURCES: dict[str, str] = {
    "arith": "gfcr.tasks.arith:make_arith",
    "reasoning_gym": "gfcr.tasks.rgym:make_reasoning_gym",
    "jsonl_math": "gfcr.tasks.jsonl:load_math_jsonl",
    "jsonl_code": "gfcr.tasks.jsonl:load_code_jsonl",
}


def make_source(name: str, **kw: Any) -> TaskSource:
    """Build a task source by name (``SOURCES``) or import path ``pkg.mod:fn`` returning prompts."""
    target = SOURCES.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown task source {name!r}; choose one of {sorted(SOURCES)} or give 'pkg.module:function'")
    mod, _, fn = target.partition(":")
    out = getattr(importlib.import_module(mod), fn)(**kw)
    if isinstance(out, TaskSource):
        return out
    return ListSource(name, list(out))


__all__ = ["SOURCES", "ListSource", "PoolTooSmall", "TaskSource", "make_source"]
