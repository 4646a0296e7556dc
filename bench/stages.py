"""The long benches' resumable stage loop (``bench/ross_moveon.py``, ``bench/ross_testbed.py``).

A study runs as named stages; each stage's result is written to its own JSON file when it finishes
and read back, not run again, when the study is started again. So a study cut by a reboot or a full
disk resumes at the first unfinished stage, and a finished stage's numbers are never recomputed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_stages(names: list[str], path_of: Callable[[str], Path], dispatch: dict[str, Callable[[], Any]],
               results: dict[str, Any], brief: Callable[[dict[str, Any]], dict[str, Any]] = lambda r: r,
               echo: int | None = None) -> dict[str, Any]:
    """Run ``names`` in order into ``results``: a stage whose file (``path_of(stage)``) exists is read,
    else ``dispatch[stage]()`` runs (it may read the earlier stages' entries of ``results``) and its
    result is written there (indented JSON) and printed (``brief`` of it, cut to ``echo`` characters).
    An unknown stage stops the study in one line naming the known ones, before it runs anything."""
    unknown = [s for s in names if s not in dispatch]
    if unknown:
        raise SystemExit(f"unknown stage {unknown[0]!r} ({', '.join(dispatch)})")
    for stage in names:
        path = path_of(stage)
        if path.exists():
            results[stage] = json.loads(path.read_text())
            continue
        results[stage] = dispatch[stage]()
        path.write_text(json.dumps(results[stage], indent=1))
        print(json.dumps({stage: brief(results[stage])}, indent=1, default=str)[:echo], flush=True)
    return results
