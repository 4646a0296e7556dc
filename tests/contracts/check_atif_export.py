"""Validate gfcr's ATIF export with Harbor's own validator (not run in CI).

Framework: harbor 0.26.0 (PyPI wheel, unpacked; needs pydantic): ``TrajectoryValidator``
(``harbor/utils/trajectory_validator.py``, Harbor's Pydantic ``Trajectory`` models, ATIF up to
v1.8), loaded as ``gen_harbor_job.py`` loads the models. The script imports contract fixtures of
several formats into a scratch store, exports them with ``gfcr store export --to atif`` and
validates every exported trajectory; it prints one line per format and exits 1 on any error. Run:

    HARBOR_SRC=/tmp/wheels/x/harbor PYTHONPATH=src python tests/contracts/check_atif_export.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
FIX = Path(__file__).resolve().parent / "fixtures"
CASES = [("atif", FIX / "atif", {}), ("atif", FIX / "harbor_job", {}), ("prime-rl", FIX / "prime_rl" / "rollouts", {}),
         ("verl", FIX / "verl_jobs", {}), ("trl", FIX / "trl", {"reward_columns": ["accuracy_reward", "format_reward"]}), ("art", FIX / "art_0523", {}), ("atropos", FIX / "atropos", {})]


def main() -> int:
    from gen_harbor_job import _load_harbor

    src = Path(os.environ.get("HARBOR_SRC", "/tmp/wheels/x/harbor"))
    _load_harbor(src)
    spec = importlib.util.spec_from_file_location("harbor.utils.trajectory_validator",
                                                  src / "harbor" / "utils" / "trajectory_validator.py")
    val = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(val)
    from gfcr.formats import import_rollouts
    from gfcr.formats.export import export
    from gfcr.store import RolloutStore

    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, (fmt, path, kw) in enumerate(CASES):
            st = RolloutStore.open(Path(tmp) / f"s{k}", create=True)
            import_rollouts(st, fmt, [str(path)], run_id=f"r{k}", **kw)
            out = Path(tmp) / f"e{k}.atif.jsonl"
            export(st, "atif", out)
            errors = []
            lines = out.read_text().splitlines()
            for i, line in enumerate(lines, 1):
                v = val.TrajectoryValidator()
                if not v.validate(json.loads(line)):
                    errors.append(f"line {i}: {v.get_errors()[:2]}")
            bad += len(errors)
            version = json.loads(lines[0])["schema_version"]
            print(f"{fmt:9s} {path.name:12s} {len(lines)} trajectories ({version}): "
                  + ("valid" if not errors else f"{len(errors)} invalid: {errors[:2]}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
