"""``python -m gfcr.cli``: the ``gfcr`` command (used by torchrun and the tests)."""

from gfcr.cli import main

main()
