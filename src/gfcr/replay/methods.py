"""How a config chooses a replay buffer: ``NAME`` or ``{name: NAME, params: {...}}``
(:class:`gfcr.config.Method`), the params checked against the named buffer's own parameters.

``gfcr train`` uses it as ``replay.buffer``; ``gfcr simulate``'s strategies subclass it only to name
their own config path in errors. Example: ``BufferMethod.model_validate("repo").typed()`` holds
RePO's defaults.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gfcr.config import Method


class BufferMethod(Method):
    """A replay buffer of :data:`gfcr.replay.buffers.BUFFERS`."""

    kind: ClassVar[str] = "buffer"
    path: ClassVar[str] = "replay.buffer"

    @classmethod
    def table(cls) -> Any:
        from gfcr.replay.buffers import BUFFERS

        return BUFFERS
