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

from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import AliasChoices, Field, model_validator

from gfcr.config import StrictModel, check_component, resolve_object
from gfcr.records import Prompt


class TaskConfig(StrictModel):
    """Where prompts come from: a task source by name and its keyword arguments. The one task
    vocabulary of every config (``gfcr generate``, ``gfcr train`` adds how many prompts per split).
    ``source``/``args`` are accepted as the older spellings of ``name``/``params``."""

    name: str = Field("arith", validation_alias=AliasChoices("name", "source"),
                      description=(
                          "Task source name (arith, reasoning_gym, jsonl_math, jsonl_code) or 'pkg.mod:fn'."))
    params: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("params", "args"),
                                   description=(
                                       "Keyword arguments of the task source (arith: n, level, digits, "
                                       "terms, ops; jsonl_math: path), checked against the source's "
                                       "parameters at config load."))

    #: config path of this section in error messages
    path: ClassVar[str] = "tasks"

    @model_validator(mode="after")
    def _params(self) -> TaskConfig:
        self.params = check_component(f"{self.path}.params", "task source", self.name, SOURCES, self.params)
        return self


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
    out = resolve_object(name, SOURCES, "task source")(**kw)
    if isinstance(out, TaskSource):
        return out
    return ListSource(name, list(out))


__all__ = ["SOURCES", "ListSource", "PoolTooSmall", "TaskConfig", "TaskSource", "make_source"]
