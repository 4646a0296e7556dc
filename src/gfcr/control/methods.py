"""How a config chooses a prompt selector or a group policy: ``NAME`` or ``{name: NAME, params: {...}}``
(:class:`gfcr.config.Method`), the params checked against the named class's own parameters.

``gfcr train`` uses these as ``control.selector`` and ``control.group``; ``gfcr simulate``'s strategies
subclass them only to name their own config path in errors. Example:
``SelectorMethod.model_validate({"name": "greso", "params": {"p_min": 0.01}}).typed().p_min == 0.01``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gfcr.config import Method


class SelectorMethod(Method):
    """A prompt selector of :data:`gfcr.control.selectors.SELECTORS`."""

    kind: ClassVar[str] = "selector"
    path: ClassVar[str] = "control.selector"
    skip: ClassVar[tuple[str, ...]] = ("prompt_ids", "categories")

    @classmethod
    def table(cls) -> Any:
        from gfcr.control.selectors import SELECTORS

        return SELECTORS


class GroupMethod(Method):
    """A group policy of :data:`gfcr.control.policies.GROUP_POLICIES`."""

    kind: ClassVar[str] = "group policy"
    path: ClassVar[str] = "control.group"
    skip: ClassVar[tuple[str, ...]] = ("decide_on",)

    @classmethod
    def table(cls) -> Any:
        from gfcr.control.policies import GROUP_POLICIES

        return GROUP_POLICIES
