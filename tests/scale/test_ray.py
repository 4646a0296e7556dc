"""gfcr.scale on a real local Ray cluster (one per module, 2 CPUs, loopback only, tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gfcr.generate.config import GenerateConfig
from gfcr.records import Message, Prompt, Rollout
from gfcr.store import RolloutStore

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def prompts():
    from gfcr.tasks.arith import make_arith

    return make_arith(n=4, level=1, seed=3).prompts()


def test_local_cluster_is_loopback_only(cluster):
    import os

    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert not os.environ.get("HTTP_PROXY", "").endswith("127.0.0.1:9")  # the driver's env is restored


def _config(store, model, **kw) -> GenerateConfig:
    base = {"store": str(store), "run_id": "r1", "seed": 7, "batch_prompts": 2,
            "engine": {"name": "hf", "model": model}, "topology": {"name": "group", "params": {"k": 2}},
            "sampling": {"temperature": 1.0, "max_tokens": 6}}
    base.update(kw)
    return GenerateConfig.model_validate(base)


def _key(rs):
    return sorted(((r.prompt_id, r.sample_index, tuple(r.token_ids.tolist()), r.logprobs) for r in rs),
                  key=lambda t: (t[0], t[1]))


def test_generate_same_rollouts_with_1_or_2_workers_one_commit(cluster, tmp_path, tiny_dir, prompts):
    from gfcr.generate.run import run_generate
    from gfcr.scale import ray_generate

    s1 = RolloutStore.open(tmp_path / "w1", create=True)
    s2 = RolloutStore.open(tmp_path / "w2", create=True)
    v2 = len(s2.versions())
    out1 = ray_generate(_config(s1.path, tiny_dir), workers=1, prompts=prompts)
    out2 = ray_generate(_config(s2.path, tiny_dir), workers=2, prompts=prompts)
    # 4 prompts / 2 per shard = 2 shards; 2 workers -> both shards in one commit, 1 worker -> one each
    assert (out1["shards"], out1["commits"], out2["commits"], out2["workers"]) == (2, 2, 1, 2)
    assert len(s2.versions()) == v2 + 1
    r1, r2 = s1.rollouts(), s2.rollouts()
    assert len(r2) == out2["rollouts"] == 4 * 2 and len({r.rollout_id for r in r2}) == 8
    assert {r.prompt_id for r in r2} == {p.prompt_id for p in prompts}
    assert {p.prompt_id for p in s2.prompts()} == {p.prompt_id for p in prompts}
    assert all(r.policy_version == out2["policy_version"] and r.n_generated > 0 for r in r2)
    k1, k2 = _key(r1), _key(r2)
    for a, b in zip(k1, k2, strict=True):
        assert a[:3] == b[:3]
        np.testing.assert_array_equal(a[3], b[3])
    # and the same as the in-process `gfcr generate` path, shard for shard
    s0 = tmp_path / "local"
    run_generate(_config(s0, tiny_dir, tasks={"source": "arith", "args": {"n": 4, "level": 1, "seed": 3}}),
                 progress=False)
    k0 = _key(RolloutStore.open(s0).rollouts())
    assert [a[:3] for a in k0] == [b[:3] for b in k2]
    for a, b in zip(k0, k2, strict=True):
        np.testing.assert_allclose(a[3], b[3], atol=1e-5)


def test_failing_shard_leaves_store_unchanged(cluster, tmp_path, prompts):
    from gfcr.scale import ScaleError, ray_generate

    st = RolloutStore.open(tmp_path / "s", create=True)
    before = (st.version, len(st.versions()), st.count(), len(st.prompts()))

    def factory():  # nested (function and class): Ray pickles them by value into the actors
        class Boom:
            name = "boom"
            policy_version = "boom-0"

            def generate(self, requests):
                raise RuntimeError("engine exploded on purpose")

        return Boom()

    with pytest.raises(ScaleError, match=r"shard \d .*RuntimeError: engine exploded on purpose.*not written"):
        ray_generate(_config(st.path, None), workers=2, prompts=prompts, engine_factory=factory, max_retries=1)
    st = RolloutStore.open(tmp_path / "s")
    assert (st.version, len(st.versions()), st.count(), len(st.prompts())) == before
    assert not (tmp_path / "s" / "runs").exists()


def test_failed_shard_is_retried(cluster, tmp_path, tiny_dir, prompts):
    from gfcr.scale import ray_generate

    marker = tmp_path / "failed-once"

    def factory():  # fails on the first build anywhere (shared marker file), then works
        from gfcr.generate.engines.hf import HFEngine

        if not marker.exists():
            marker.write_text("x")
            raise RuntimeError("transient")
        return HFEngine(tiny_dir)

    st = RolloutStore.open(tmp_path / "s", create=True)
    out = ray_generate(_config(st.path, None), workers=1, prompts=prompts[:2], engine_factory=factory)
    assert out["retries"] == 1 and out["commits"] == 1 and st.count() == 2 * 2


def _rollout(pid: str, text: str, i: int) -> Rollout:
    return Rollout(run_id="run1", prompt_id=pid, task="arith", sample_index=i, token_ids=[1, 2, 3],
                   token_role=[0, 1, 1], logprobs=[0.0, -0.1, -0.2], reward=0.5,
                   messages=[Message("user", "q"), Message("assistant", text)])


VERIFY_PROMPTS = [Prompt(prompt_id="p1", task="arith", messages=[Message("user", "1+2?")], answer="3"),
                  Prompt(prompt_id="p2", task="arith", messages=[Message("user", "3/4?")], answer="3/4")]
TEXTS = [("p1", "Answer: 3"), ("p1", "Answer: 4"), ("p2", "\\boxed{0.75}"), ("p2", "no idea"),
         ("p2", "so it is \\frac{6}{8}"), ("zz", "Answer: 1"), ("p1", "3.0")]


def _strip(v):
    return {k: x for k, x in v.items() if k != "cost_s"}


def test_ray_verify_equals_verify_many_and_writes_one_version(cluster, tmp_path):
    from gfcr.filters import verify_many
    from gfcr.scale import ray_verify

    st = RolloutStore.open(tmp_path / "s", create=True)
    st.upsert_prompts(VERIFY_PROMPTS)
    st.append([_rollout(p, t, i) for i, (p, t) in enumerate(TEXTS)])
    n_versions = len(st.versions())
    stored = st.rollouts()
    local = {r.rollout_id: r for r in verify_many(stored, "math", VERIFY_PROMPTS)}
    out = ray_verify(st, "math", workers=2, chunk_size=3)
    assert (out["n"], out["chunks"], out["workers"], out["missing_prompts"]) == (7, 3, 2, 1)
    assert len(st.versions()) == n_versions + 1
    after = st.rollouts()
    assert len(after) == 7
    for r in after:
        exp = local[r.rollout_id]
        assert (r.reward, r.verified) == (exp.reward, exp.verified)
        assert _strip(r.verifier) == _strip(exp.verifier)
    assert sorted(r.verified is True for r in after).count(True) == out["passed"] == 3


def test_ray_verify_says_how_many_workers_and_commits_only_a_change(cluster, tmp_path):
    """Issue 45: ``--workers 4`` on one chunk ran 1 actor without saying so, and a re-run that changed
    nothing committed a version anyway."""
    from gfcr.cli import app
    from gfcr.scale.verify import workers_note

    assert workers_note(4, 1, 78, 256) == "1 of 4 workers: 78 rollouts are 1 chunk of at most 256 (--chunk-size 20 gives 4)"
    assert workers_note(2, 2, 78, 20) is None
    st = RolloutStore.open(tmp_path / "s", create=True)
    st.upsert_prompts(VERIFY_PROMPTS)
    st.append([_rollout(p, t, i) for i, (p, t) in enumerate(TEXTS)])
    runner = CliRunner()
    res = runner.invoke(app, ["scale", "verify", str(st.path), "--verifier", "math", "--workers", "4"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["workers"] == 1 and out["written"] and out["version_after"] == out["version_before"] + 1
    assert "note: 1 of 4 workers: 7 rollouts are 1 chunk of at most 256 (--chunk-size 2 gives 4)" in res.stderr
    n_versions = len(st.versions())
    res = runner.invoke(app, ["scale", "verify", str(st.path), "--verifier", "math", "--workers", "2", "--chunk-size", "4"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["changed"] == 0 and not out["written"] and out["version_after"] == out["version_before"]
    assert len(RolloutStore.open(st.path).versions()) == n_versions
    assert "nothing written" in res.stderr


def test_math_verify_runs_on_actor_main_thread(cluster):
    from gfcr.scale import VerifyWorker

    actor = ray.remote(num_cpus=1)(VerifyWorker).remote("math")
    try:
        env = ray.get(actor.environment.remote())
    finally:
        ray.kill(actor)
    assert env["main_thread"] is True
    assert env["math_verify"] is True  # its default signal timeouts work there


def test_cli_generate_then_verify(cluster, tmp_path, tiny_dir):
    from gfcr.cli import app

    runner = CliRunner()
    store = tmp_path / "s"
    res = runner.invoke(app, ["scale", "generate", "--store", str(store), "--model", tiny_dir, "--workers", "2",
                              "--n", "3", "--k", "2", "--max-tokens", "5", "--batch-prompts", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert (summary["rollouts"], summary["shards"], summary["commits"]) == (6, 3, 2)
    assert RolloutStore.open(store).count() == 6
    res = runner.invoke(app, ["scale", "verify", str(store), "--verifier", "numeric", "--workers", "2",
                              "--chunk-size", "4"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["n"] == 6 and out["version_after"] == out["version_before"] + 1
    assert all(r.verifier.get("name") == "numeric" for r in RolloutStore.open(store).rollouts())
    res = runner.invoke(app, ["scale", "verify", str(store), "--verifier", "nope"])
    assert res.exit_code != 0 and "unknown verifier" in res.output


#: run in a Python process of its own: Ray is started there before any Lance thread exists (a pytest worker
#: that has run Lance reads and then holds a Ray driver crashed once in a fresh clone's suite; see
#: tests/conftest.py on forking a many-threaded parent)
_SCALE_IMPORT_SCENARIO = r"""
import json, shutil, sys
from pathlib import Path
from typer.testing import CliRunner
from gfcr.scale import init_ray
init_ray(num_cpus=2)
from gfcr.cli import app
from gfcr.formats import import_rollouts
from gfcr.scale.cluster import ScaleError
from gfcr.scale.importing import ray_import
from gfcr.store import RolloutStore

tmp, verl = Path(sys.argv[1]), Path(sys.argv[2])
serial = RolloutStore.open(tmp / "serial", create=True)
import_rollouts(serial, "verl", [str(verl)])
store = RolloutStore.open(tmp / "scaled", create=True)
v0 = store.version
out = ray_import(store, "verl", [str(verl)], workers=2)
assert (out["workers"], out["written"], store.count(), store.version) == (2, 8, 8, v0 + 1), out  # one commit
cols = [c for c in store.dataset("rollouts").schema.names if c != "created_at"]
assert store.scan(columns=cols).sort_by("rollout_id").equals(serial.scan(columns=cols).sort_by("rollout_id"))
# one worker's share holds a malformed line: the other worker staged its rows, nothing is committed
dump = tmp / "dump"
shutil.copytree(verl, dump)
(dump / "2.jsonl").write_text((verl / "2.jsonl").read_text() + "{not json\n")
fresh = RolloutStore.open(tmp / "fresh", create=True)
try:
    ray_import(fresh, "verl", [str(dump)], workers=2)
    raise AssertionError("a failing worker did not fail the import")
except ScaleError as e:
    assert "worker for 2.jsonl failed" in str(e) and "nothing was committed: the store is as it was (0" in str(e), e
assert fresh.count() == 0 and fresh.version == v0 and fresh.count("prompts") == 0
res = CliRunner().invoke(app, ["scale", "import", str(tmp / "fresh"), str(dump), "--from", "verl", "-w", "2"])
assert res.exit_code == 1 and "error: the import worker for 2.jsonl failed" in res.output, res.output
assert RolloutStore.open(tmp / "fresh").count() == 0
res = CliRunner().invoke(app, ["scale", "import", str(tmp / "fresh"), str(verl), "--from", "verl", "-w", "2"])
assert res.exit_code == 0, res.output
summary = json.loads(res.output.strip().splitlines()[-1])
assert (summary["written"], summary["workers"], summary["files"]) == (8, 2, 2), summary
assert RolloutStore.open(tmp / "fresh").count() == 8
print("scenario ok")
"""


def test_scale_import_two_workers_equals_store_import_and_a_failed_worker_commits_nothing(tmp_path):
    """Two workers store what `gfcr store import` stores, in one commit; a failing worker commits
    nothing; the command exits 1 with one line, then imports the good dump (its own Ray cluster)."""
    import subprocess
    import sys

    verl = Path(__file__).parents[1] / "contracts" / "fixtures" / "verl"
    res = subprocess.run([sys.executable, "-c", _SCALE_IMPORT_SCENARIO, str(tmp_path), str(verl)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "scenario ok" in res.stdout, (res.stdout[-2000:], res.stderr[-4000:])
