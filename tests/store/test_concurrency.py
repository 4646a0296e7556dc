"""Several writer processes at once, and writers killed mid-append."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from gfcr.store import RolloutStore
from gfcr.store.core import TABLES
from gfcr.store.integrity import check_store

WRITER = r"""
import sys, json
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout
path, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = RolloutStore.open(path)
for b in range(batches):
    rs = [make_rollout(i, step=b, run=tag, n_ctx=32, n_gen=96, seed=b, rollout_id=f"{tag}-{b}-{i}") for i in range(size)]
    store.append(rs)
    print(json.dumps({"committed": b}), flush=True)
"""


def _spawn(path, tag, batches, size):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, str(batches), str(size)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_three_writers_lose_and_duplicate_nothing(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    procs = [_spawn(store.path, f"w{k}", 8, 25) for k in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    ids = store.scan(columns=["rollout_id"]).column("rollout_id").to_pylist()
    assert len(ids) == 3 * 8 * 25
    assert len(set(ids)) == len(ids)
    assert set(ids) == {f"w{k}-{b}-{i}" for k in range(3) for b in range(8) for i in range(25)}
    # racing records (each append digests only its own fragment when the manifest is in step, else
    # compares the whole table) leave the newest version recorded and every data file digested
    rep = check_store(store.path, list(TABLES))
    assert rep.ok and sum(t.files_digested for t in rep.tables) > 0
    assert all(t.files_not_digested == 0 for t in rep.tables), [(t.name, t.files_not_digested) for t in rep.tables]
    assert RolloutStore.open(store.path).manifest["committed"]["rollouts"]["version"] == store.version


def test_sigkill_mid_append_keeps_every_committed_row(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    rng = np.random.default_rng(0)
    committed: set[tuple[str, int]] = set()
    kills = 0
    for it in range(22):
        tag = f"k{it}"
        p = _spawn(store.path, tag, 1000, 40)
        # wait for the first commit, then kill at a random moment of a later append
        first = p.stdout.readline()
        assert first, p.stderr.read()
        committed.add((tag, json.loads(first)["committed"]))
        time.sleep(float(rng.uniform(0.0, 0.4)))
        os.kill(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        kills += p.returncode == -signal.SIGKILL
        for line in out.splitlines():
            committed.add((tag, json.loads(line)["committed"]))
        # the store opens, and every row reported committed is intact
        s2 = RolloutStore.open(store.path)
        t = s2.scan(run=tag, columns=["rollout_id", "step"])
        got = set(t.column("rollout_id").to_pylist())
        for (tg, b) in committed:
            if tg == tag:
                assert {f"{tag}-{b}-{i}" for i in range(40)} <= got
        # no batch is half-written: every step present has all its 40 rows
        steps = t.column("step").to_numpy()
        assert all(np.count_nonzero(steps == s) == 40 for s in set(steps.tolist()))
    assert kills >= 20
    # a full read of every row still works after the kills
    full = RolloutStore.open(store.path).rollouts()
    assert len(full) == sum(1 for _ in full) and len(full) >= 40 * len(committed)
