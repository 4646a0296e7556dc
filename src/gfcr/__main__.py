"""``python -m gfcr``: the same CLI as the ``gfcr`` command."""

from gfcr.cli import main

if __name__ == "__main__":
    main()
