"""The store on object storage, against a real S3 protocol server on loopback (moto's server mode,
started by the suite: ``s3_server`` in conftest.py). The store's contract tests run on both local
disk and S3 through the ``store_uri`` fixture (test_store.py, test_reads.py, test_cli.py); the fault,
kill -9 and many-writer tests run on S3 and Azure in test_object_store_faults.py. Here is what is
particular to S3: racing imports, the manifest committed once, nothing created on local disk, the
commands on an ``s3://`` store, and one-line errors."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import lance
import pytest
from tests.store.conftest import S3_BUCKET, free_port, s3_uri

from gfcr.store import RolloutStore, StoreError
from gfcr.store.commits import retry_commit
from gfcr.store.errors import CommitGaveUp, is_conflict
from gfcr.store.location import locate
from gfcr.store.opening import MANIFEST_KEY
from gfcr.testing import make_rollout

VERL = Path(__file__).parents[1] / "contracts" / "fixtures" / "verl"
PRIME_RL = Path(__file__).parents[1] / "contracts" / "fixtures" / "prime_rl"


def _keys(prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    out = s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix)
    return [o["Key"] for o in out.get("Contents", [])]


def test_two_racing_imports_of_one_dump_store_each_rollout_once(s3_env, tmp_path):
    """No lock on object storage: the insert-if-absent commit (gfcr.store.keys) keeps racing imports
    exact. Without it (a plain append after the look-up) both imports would write the 8 rows."""
    uri = s3_uri("imports")
    store = RolloutStore.open(uri, create=True)
    ds = store.dataset("rollouts")
    assert ds.schema.field("rollout_id").metadata[b"lance-schema:unenforced-primary-key"] == b"true"
    code = ("import sys; from gfcr.store import RolloutStore; from gfcr.formats import import_rollouts; "
            "r = import_rollouts(RolloutStore.open(sys.argv[1]), 'verl', [sys.argv[2]]); print(r.written)")
    for _ in range(2):
        procs = [subprocess.Popen([sys.executable, "-c", code, uri, str(VERL)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e[-1500:] for _, e in outs]
    ids = store.scan(columns=["rollout_id"]).column("rollout_id").to_pylist()
    assert len(ids) == 8 and len(set(ids)) == 8
    assert store.count("prompts") == len(set(store.dataset("prompts").to_table().column("prompt_id").to_pylist()))


def test_manifest_is_committed_once_with_the_table_and_never_rewritten(s3_env):
    uri = s3_uri("manifest")
    store = RolloutStore.open(uri, create=True)
    first = store.dataset("rollouts").schema.metadata[MANIFEST_KEY.encode()]
    m = json.loads(first)
    assert m["format"] == "gfcr-store" and "conditional PUT" in m["commit_handler"]
    for b in range(3):
        store.append([make_rollout(b * 10 + i, step=b) for i in range(5)])
    r = store.rollouts(steps=(0, 0))[0]
    r.reward = -1.0
    store.update([r])
    store.compact()
    assert store.dataset("rollouts").schema.metadata[MANIFEST_KEY.encode()] == first
    prefix = uri.split(f"{S3_BUCKET}/", 1)[1]
    keys = _keys(prefix)
    assert keys and not [k for k in keys if k.endswith(".json") or ".lock" in k or "aggregates" in k]
    # a racing second init keeps the first manifest
    assert RolloutStore.open(uri, create=True).manifest == m
    # a Lance table without the manifest is refused, not adopted
    other = s3_uri("plain")
    lance.write_dataset(store.dataset("state").to_table(), f"{other}/rollouts.lance")
    with pytest.raises(StoreError, match="not a gfcr store"):
        RolloutStore.open(other)


def test_remote_uri_creates_nothing_on_local_disk(s3_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = s3_uri("nolocal")
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", "store", "init", uri], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    st = RolloutStore.open(uri)
    st.append([make_rollout(i) for i in range(3)])
    assert st.count() == 3 and isinstance(st.path, str) and st.path == uri
    with pytest.raises(StoreError, match="no gfcr store"):
        RolloutStore.open(uri + "-missing")
    assert list(tmp_path.iterdir()) == []


def test_bad_scheme_and_unreachable_endpoint_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    for uri, want in [("ftp://bkt/x", "unknown store URI scheme 'ftp'"), ("s3://bkt/x", "cannot reach the store"),
                      ("s3:///x", "names no bucket"), ("memory://x", "cannot detect a racing commit")]:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "gfcr.cli", "store", "init", uri], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and want in p.stderr, p.stderr
        assert "damaged" not in p.stderr and ".rs:" not in p.stderr
        assert time.monotonic() - t0 < 60  # bounded retries (gfcr.store.location.REMOTE_DEFAULTS)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(StoreError, match="storage_options were given for the local path"):
        locate("local/dir", {"aws_endpoint": "x"})
    # a commit without its conditional PUT cannot detect a racing writer: refused unless opted in
    with pytest.raises(StoreError, match="aws_conditional_put=disabled cannot detect a racing commit"):
        locate("s3://bkt/x", {"aws_conditional_put": "disabled"})
    assert locate("s3://bkt/x", {"aws_conditional_put": "disabled"}, allow_unsafe_commits=True).remote


def test_storage_options_pass_through_without_environment(s3_server, monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(k, raising=False)
    opts = {"aws_endpoint": s3_server, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "allow_http": "true"}
    uri = s3_uri("opts")
    st = RolloutStore.open(uri, create=True, storage_options=opts, auto_compact=2)
    for b in range(3):  # automatic compaction writes and commits through the same options
        st.append([make_rollout(b * 10 + i, step=b) for i in range(3)])
    assert st.compactions and st.count() == 9
    assert RolloutStore.open(uri, storage_options=opts).count() == 9


def test_s3_cli_init_import_query_export_report(s3_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = s3_uri("cli")

    def gfcr(*args):
        p = subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr + p.stdout
        return p.stdout

    out = gfcr("store", "init", uri)
    assert "store ready at " + uri in out and "S3 conditional PUT" in out  # the commit handler, named
    assert "imported 8 new rollouts" in gfcr("store", "import", uri, VERL, "--from", "verl")
    assert "8 already stored" in gfcr("store", "import", uri, VERL, "--from", "verl")
    assert [json.loads(x) for x in gfcr("store", "query", uri, "SELECT count(*) AS n FROM rollouts",
                                        "--json").splitlines()] == [{"n": 8}]
    # verl's logged prompts are templated text (kept verbatim, never re-templated): refused in one line
    bad = subprocess.run([sys.executable, "-m", "gfcr.cli", "store", "export-sft", uri, str(tmp_path / "no.parquet"),
                          "--format", "messages"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "skipped {'templated_prompt': 8}" in bad.stderr
    assert "imported 5 new rollouts" in gfcr("store", "import", uri, PRIME_RL, "--from", "prime-rl")
    assert "wrote 4 rows" in gfcr("store", "export-sft", uri, tmp_path / "sft.parquet", "--format", "messages",
                                  "--where", "task != 'verl'")
    assert gfcr("report", uri, "--out", tmp_path / "r.html").strip().endswith("r.html")
    assert "ok: " + uri in gfcr("store", "check", uri)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.html", "sft.parquet"]


def test_retry_commit_recognises_lance_conflicts_only_and_gives_up_in_one_line():
    from lance.commit import CommitConflictError

    assert is_conflict(CommitConflictError("preempted"))
    assert is_conflict(OSError("Too many concurrent writers. Retried 20 times"))
    assert is_conflict(OSError("Retryable commit conflict for version 7: x"))
    # loose words are not a conflict (the old check retried these)
    assert not is_conflict(OSError("could not commit: retry later, disk full"))
    assert not is_conflict(ValueError("merge conflict in config"))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("Too many concurrent writers. ")
        return "ok"

    assert retry_commit(flaky) == "ok" and len(calls) == 3
    with pytest.raises(CommitGaveUp) as e:
        retry_commit(lambda: (_ for _ in ()).throw(CommitConflictError("lost")), attempts=3, max_sleep=0.01)
    assert "3 times in a row" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(OSError, match="disk full"):
        retry_commit(lambda: (_ for _ in ()).throw(OSError("commit retry: disk full")))


def test_generate_writes_its_rollouts_and_resolved_config_to_an_s3_store(s3_env, tiny_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gfcr.cli import app

    monkeypatch.chdir(tmp_path)
    uri = s3_uri("gen")
    res = CliRunner().invoke(app, ["generate", "--store", uri, "--model", tiny_dir, "--n", "2", "--k", "2",
                                   "--max-tokens", "4", "--run-id", "g1", "--quiet"])
    assert res.exit_code == 0, res.output
    st = RolloutStore.open(uri)
    rs = st.rollouts(run="g1")
    assert len(rs) == 4 and {r.meta["config"] for r in rs} == {"runs/g1/generate-step0.yaml"}
    assert st.get_state("runs/g1/generate-step0.yaml")["run_id"] == "g1"  # the resolved config, kept in the store
    assert list(tmp_path.iterdir()) == []


def test_viewer_serves_an_s3_store(s3_env):
    from fastapi.testclient import TestClient

    from gfcr.diagnose.viewer import create_app

    uri = s3_uri("view")
    RolloutStore.open(uri, create=True).append([make_rollout(i, step=i) for i in range(3)])
    c = TestClient(create_app(uri))
    s = c.get("/api/summary").json()
    assert s["store"] == uri and s["runs"][0]["rollouts"] == 3
    items = c.get("/api/rollouts").json()["items"]
    assert len(items) == 3 and c.get(f"/api/rollouts/{items[0]['rollout_id']}").status_code == 200


@pytest.mark.slow  # a 1-step RL run of a tiny model
def test_gfcr_train_writes_its_store_on_s3(s3_env, tmp_path):
    from tests.train.test_train_cli import _config

    uri = s3_uri("train")
    cfg = _config(tmp_path, steps=1)
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", "train", str(cfg), "--run-dir", str(tmp_path / "run"),
                        "--no-progress", "--set", f"store={uri}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert uri in p.stdout and not (tmp_path / "run" / "store").exists()
    t = RolloutStore.open(uri).scan(columns=["step", "run_id"])
    assert t.column("step").to_pylist() == [0] * 4 and set(t.column("run_id").to_pylist()) == {"run"}


def test_ross_select_reads_an_s3_store(s3_env, tmp_path, monkeypatch):
    from gfcr.testing import make_prompt

    monkeypatch.chdir(tmp_path)
    uri = s3_uri("ross")
    st = RolloutStore.open(uri, create=True)
    st.upsert_prompts([make_prompt(f"p{i}", answer=str(i)) for i in range(4)])
    st.append([make_rollout(i, prompt=f"p{i % 4}", verified=True, reward=1.0) for i in range(8)])
    cfg = Path(__file__).parents[2] / "configs" / "ross-arith.yaml"
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", "ross", "select", str(cfg), "--set", f"store={uri}",
                        "--set", "upstream_model=unused"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    assert (got["rollouts"], got["prompts"]) == (8, 4)
    assert list(tmp_path.iterdir()) == []


def test_retrieval_on_an_s3_store_is_refused_in_one_line(s3_env, tmp_path, monkeypatch):
    from gfcr.replay.retrieval import Retrieval

    monkeypatch.chdir(tmp_path)
    st = RolloutStore.open(s3_uri("retr"), create=True)
    with pytest.raises(ValueError, match="local store folder only"):
        Retrieval.for_store(st)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_bucket_is_one_line(s3_env):
    with pytest.raises(StoreError, match=r"^the bucket 'no-such-bucket' of s3://no-such-bucket/x does not exist at the "
                                         r"endpoint; create it first"):
        RolloutStore.open("s3://no-such-bucket/x", create=True)


def test_the_test_servers_conditional_puts_refuse_the_second_of_a_race(s3_server):
    """The suite's S3 server keeps S3's guarantee that Lance's commits rely on: of racing
    ``If-None-Match: *`` PUTs of one key, exactly one succeeds and the others get 412. moto alone
    checks and then writes (gfcr.testing.S3Server): with thread switches this frequent, 8 threads on
    each of 200 keys got two successes for 3 keys before the server serialised conditional PUTs."""
    import threading

    import botocore

    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    prefix = s3_uri("race").split(f"s3://{S3_BUCKET}/", 1)[1]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # widen moto's window between its check and its write
    try:
        for key in range(100):
            won, refused = [], []
            barrier = threading.Barrier(8)

            def put(i, key=key, won=won, refused=refused, barrier=barrier):
                barrier.wait()
                try:
                    s3.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/k{key}", Body=bytes([i]) * 1000, IfNoneMatch="*")
                    won.append(i)
                except botocore.exceptions.ClientError as e:
                    refused.append(e.response["ResponseMetadata"]["HTTPStatusCode"])

            threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(won) == 1 and refused == [412] * 7, (key, won, refused)
            body = s3.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/k{key}")["Body"].read()
            assert body == bytes(won) * 1000  # the stored object is the winner's
    finally:
        sys.setswitchinterval(old)
