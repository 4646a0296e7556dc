import json
import subprocess
import sys
from pathlib import Path

import pytest

from gfcr.store import samples as S


def gfcr(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


@pytest.mark.parametrize("store_uri", ["local", "s3"], indirect=True)  # (az://: test_azure.py's shorter round trip)
def test_store_cli_end_to_end(tmp_path: Path, store_uri):
    st = store_uri  # a local directory, or a URI on the loopback S3 server
    assert "store ready" in gfcr("store", "init", st).stdout
    S.write_verl(tmp_path / "verl", steps=2)
    out = gfcr("store", "import", st, tmp_path / "verl", "--from", "verl", "--run", "r1").stdout
    assert "imported 24 new rollouts" in out and "without tokens" in out
    rows = json.loads(gfcr("store", "stats", st, "--json").stdout)
    assert [(r["run_id"], r["step"], r["n_rollouts"]) for r in rows] == [("r1", 1, 12), ("r1", 2, 12)]
    q = gfcr("store", "query", st, "SELECT step, count(*) AS n FROM rollouts GROUP BY step ORDER BY step", "--json")
    assert [json.loads(x) for x in q.stdout.splitlines()] == [{"step": 1, "n": 12}, {"step": 2, "n": 12}]
    assert "12" in gfcr("store", "query", st, "SELECT count(*) AS n FROM rollouts WHERE step = 2").stdout
    bad = gfcr("store", "query", st, "SELECT nope FROM rollouts", ok=False)
    assert bad.returncode == 2 and "SQL error" in bad.stderr
    exp = tmp_path / "e.jsonl"
    assert "wrote 12 rollouts" in gfcr("store", "export", st, exp, "--to", "jsonl", "--where", "step = 1").stdout
    assert len(exp.read_text().splitlines()) == 12
    vs = json.loads(gfcr("store", "versions", st, "--json").stdout)
    assert len(vs) >= 2 and vs[-1]["rows"] == 24
    assert "rollouts" in gfcr("store", "compact", st).stdout
    # malformed input: clear error naming file and line, store unchanged
    badf = tmp_path / "bad.jsonl"
    badf.write_text('{"input": "q", "output": "a", "score": 1.0, "step": 1}\n{"input": "q", "out\n')
    p = gfcr("store", "import", st, badf, "--from", "verl", ok=False)
    assert p.returncode == 2 and "bad.jsonl" in p.stderr and "line 2" in p.stderr
    assert sum(r["n_rollouts"] for r in json.loads(gfcr("store", "stats", st, "--json").stdout)) == 24
    missing = gfcr("store", "stats", tmp_path / "nope", ok=False)
    assert missing.returncode == 2 and "gfcr store init" in missing.stderr


def test_walkthrough(tmp_path):
    out = gfcr("store", "walkthrough", tmp_path / "w").stdout
    assert "verl dump: 24 new, 0 already stored" in out and "token_faithful" in out
    assert "roll dump: 24 new" in out
