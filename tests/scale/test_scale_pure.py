"""gfcr.scale without a Ray cluster: import hygiene, missing-Ray error, pure helpers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gfcr.records import Message, Rollout
from gfcr.scale import ScaleError, apply_verdicts, import_ray, shard


def test_import_does_not_import_ray_or_torch():
    code = "import sys, gfcr.scale, gfcr.cli.scale; print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_ray_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(ScaleError, match=r"pip install 'gfcr\[ray\]'"):
        import_ray()


def test_shard_is_consecutive_and_independent_of_workers():
    assert shard([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert shard([1, 2], 5) == [[1, 2]]
    assert shard([], 3) == []
    with pytest.raises(ValueError, match=">= 1"):
        shard([1], 0)


def test_apply_verdicts_copies_and_keeps_order():
    rs = [Rollout(run_id="r", prompt_id=f"p{i}", task="arith", token_ids=[1, 2], token_role=[0, 1],
                  logprobs=[0.0, -0.5], reward=0.0, messages=[Message("user", "q"), Message("assistant", "a")])
          for i in range(2)]
    out = apply_verdicts(rs, [(1.0, True, {"name": "x"}), (0.0, False, {"name": "y"})])
    assert [(r.prompt_id, r.reward, r.verified, r.verifier["name"]) for r in out] == [
        ("p0", 1.0, True, "x"), ("p1", 0.0, False, "y")]
    assert rs[0].verified is None and rs[0].reward == 0.0  # inputs untouched
    with pytest.raises(ValueError, match="2 rollouts but 1 verdicts"):
        apply_verdicts(rs, [(1.0, True, {})])
