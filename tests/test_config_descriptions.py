"""Config field descriptions wrap: every ``Field(description=...)`` line is at most 110 characters
(issue 46 part 4; one was 633 characters on one line). The text itself is unchanged by wrapping:
implicit string concatenation inside parentheses."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gfcr"
WIDTH = 110
#: rooms being reworked on other branches at the time of this test; their descriptions wrap there
LATER = ("store", "diagnose")


def long_description_lines(source: str) -> list[int]:
    """Line numbers (1-based) of ``Field(description=...)`` text lines wider than ``WIDTH``."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Field":
            for kw in node.keywords:
                if kw.arg == "description":
                    out += [n for n in range(kw.value.lineno, kw.value.end_lineno + 1) if len(lines[n - 1]) > WIDTH]
    return out


def test_the_checker_finds_a_long_description():
    long = 'x = Field(1, description="' + "word " * 30 + '")\n'
    half = '    "' + "word " * 15 + '"\n'
    wrapped = "x = Field(1, description=(\n" + half + half + "))\n"
    assert long_description_lines(long) == [1] and long_description_lines(wrapped) == []


def test_every_config_description_wraps():
    bad = {}
    for f in sorted(SRC.rglob("*.py")):
        if f.relative_to(SRC).parts[0] in LATER:
            continue
        if found := long_description_lines(f.read_text()):
            bad[str(f.relative_to(SRC))] = found
    assert not bad, f"Field descriptions over {WIDTH} characters a line (wrap them in parentheses): {bad}"
