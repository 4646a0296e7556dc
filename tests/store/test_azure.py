"""The store on Azure Blob (``az://``), against Azurite, Azure's own storage emulator (npm, installed by
``make azurite``), started by the suite on 127.0.0.1 (``az_server`` in conftest.py). The contract
tests of test_store.py, test_reads.py, test_staging.py and test_staged_import.py run on ``az://``
through the ``store_uri`` fixture; here: racing writer processes (and the commit handler they race
through, read from Azurite's request log), and a CLI round trip. Without node or Azurite these skip,
naming what is missing."""

import json
import os
import re
import subprocess
import sys

import pytest
from tests.store.conftest import (
    APPEND_WRITER,
    AZ_ACCOUNT,
    AZ_CONTAINER,
    AZ_KEY,
    az_uri,
    az_vars,
    free_port,
    start_azurite,
)

from gfcr.store import RolloutStore, StoreError
from gfcr.store import samples as S


def test_racing_writer_processes_lose_and_double_nothing_through_a_conditional_put(az_env, tmp_path):
    """3 processes × 8 appends of 4 rows into one ``az://`` store, on an Azurite of its own whose debug
    log shows every request: exact count, no duplicate id, and every version manifest is written with
    ``If-None-Match: *`` (the commit handler the store names), so a racing commit is refused, not lost."""
    log = tmp_path / "azurite.log"
    proc, endpoint = start_azurite(tmp_path, log=log)
    try:
        env = {**os.environ, **az_vars(endpoint)}  # the writer processes reach this Azurite by the environment;
        # this process by storage_options (Lance reads the AZURE_* variables once per process, so changing
        # them here would leave every later test of this process on this Azurite)
        opts = {"account_name": AZ_ACCOUNT, "account_key": AZ_KEY, "azure_storage_endpoint": endpoint, "allow_http": "true"}
        uri = az_uri("writers")
        store = RolloutStore.open(uri, create=True, storage_options=opts)
        assert "If-None-Match: *" in store.location.commit_handler
        procs = [subprocess.Popen([sys.executable, "-c", APPEND_WRITER, uri, f"w{k}", "8", "4"], stderr=subprocess.PIPE, text=True,
                                  env=env)
                 for k in range(3)]
        errs = [p.communicate(timeout=240)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errs
        ids = RolloutStore.open(uri, storage_options=opts).scan(columns=["rollout_id"]).column("rollout_id").to_pylist()
        assert len(ids) == 3 * 8 * 4 and len(set(ids)) == len(ids)
        assert sorted(ids) == sorted(f"w{k}-{b}-{i}" for k in range(3) for b in range(8) for i in range(4))
    finally:
        proc.terminate()
        proc.wait(10)
    puts = [ln for ln in log.read_text().splitlines()
            if "RequestMethod=PUT" in ln and re.search(r"/rollouts\.lance/_versions/\d+\.manifest ", ln)]
    assert len(puts) >= 3 * 8 + 1  # every commit of the rollouts table, plus the refused tries
    assert all('"if-none-match":"*"' in ln for ln in puts), puts[0]


def _gfcr(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def test_az_cli_round_trip_init_import_query_check(az_env, tmp_path):
    st = az_uri("cli")
    out = _gfcr("store", "init", st).stdout
    assert "store ready" in out and "If-None-Match" in out
    S.write_verl(tmp_path / "verl", steps=2)
    assert "imported 24 new rollouts" in _gfcr("store", "import", st, tmp_path / "verl", "--from", "verl", "--run", "r1").stdout
    q = _gfcr("store", "query", st, "SELECT step, count(*) AS n FROM rollouts GROUP BY step ORDER BY step", "--json")
    assert [json.loads(x) for x in q.stdout.splitlines()] == [{"step": 1, "n": 12}, {"step": 2, "n": 12}]
    chk = _gfcr("store", "check", st, "--json")
    rep = json.loads(chk.stdout.splitlines()[0])
    assert rep["ok"] is True and [t["rows"] for t in rep["tables"] if t["name"] == "rollouts"] == [24], chk.stdout
    missing = _gfcr("store", "stats", f"az://{AZ_CONTAINER}/nope", ok=False)
    assert missing.returncode == 2 and "no gfcr store at az://" in missing.stderr


def test_a_missing_container_and_an_unreachable_endpoint_are_one_line(az_env, monkeypatch):
    with pytest.raises(StoreError, match=r"^the container 'no-such' of az://no-such/x does not exist at the endpoint; "
                                         r"create it first \(gfcr creates no containers"):
        RolloutStore.open("az://no-such/x", create=True)
    opts = {"azure_storage_endpoint": f"http://127.0.0.1:{free_port()}/{AZ_ACCOUNT}"}  # nothing listens there
    with pytest.raises(StoreError, match=r"^cannot reach the store at az://.*AZURE_STORAGE_ENDPOINT") as e:
        RolloutStore.open(az_uri(), storage_options=opts)
    assert "\n" not in str(e.value)
