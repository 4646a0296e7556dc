"""The first hour of a new user (issue 45): what the CLI prints and refuses, each found on a fresh clone."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gfcr.cli import app


def _commands(t, prefix=()):
    for info in t.registered_commands:
        yield (*prefix, info.name or info.callback.__name__.replace("_cmd", "").replace("_", "-"))
    for g in t.registered_groups:
        yield from _commands(g.typer_instance, (*prefix, g.name))


def test_no_help_shows_internal_notes():
    """A docstring's "Long because" note is for the code's readers: no --help prints it."""
    cmds = list(_commands(app))
    assert ("eval",) in cmds and len(cmds) > 20
    for c in cmds:
        res = CliRunner().invoke(app, [*c, "--help"], terminal_width=100)
        assert res.exit_code == 0, (c, res.output)
        assert "Long because" not in res.output, c


class _Engine:
    def __init__(self, *a, **kw):
        self.model = a[0] if a else None


@pytest.fixture
def fake_eval(monkeypatch):
    """``gfcr eval`` with the engine and the evaluation replaced: records the verifier it was given."""
    import gfcr.evaluate
    import gfcr.generate.engines.hf
    from gfcr.evaluate import summarize

    seen = {}

    def evaluate_model(engine, prompts, *, verifier, k, **kw):
        seen["verify"], seen["prompts"] = verifier, prompts
        return summarize({p.prompt_id: [True, False, False, True][:k] for p in prompts},
                         greedy={p.prompt_id: i % 2 == 0 for i, p in enumerate(prompts)}, ks=[1, k])

    monkeypatch.setattr(gfcr.generate.engines.hf, "HFEngine", _Engine)
    monkeypatch.setattr(gfcr.evaluate, "evaluate_model", evaluate_model)
    return seen


def test_eval_default_model_uses_the_lenient_reading_and_prints_one_line(fake_eval, tmp_path):
    res = CliRunner().invoke(app, ["eval", "--model", "default", "--tasks", "arith", "--k", "4", "--n", "4"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout  # one summary line, not the JSON
    assert lines[0].startswith("4 prompts, k=4: pass@1 0.500 [") and "greedy_pass@1 0.500 [" in lines[0]
    assert "lenient_fallback=true" in res.stderr
    p = fake_eval["prompts"][0]
    # the default model's completions end with the number, not an 'Answer: N' line: the lenient reading passes them
    assert fake_eval["verify"](p, f"so the sum is {p.answer}") is True
    # --verifier-arg wins: the strict reading on request
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--verifier-arg", "lenient_fallback=false"])
    assert res.exit_code == 0 and "lenient_fallback=true" not in res.stderr
    assert fake_eval["verify"](p, f"so the sum is {p.answer}") is False
    # another model is read strictly as asked
    res = CliRunner().invoke(app, ["eval", "--model", "some/model", "--n", "4"])
    assert res.exit_code == 0 and fake_eval["verify"](p, f"so the sum is {p.answer}") is False


def test_eval_json_behind_a_flag_and_in_a_file(fake_eval, tmp_path):
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["n_prompts"] == 4 and d["info"]["verifier"] == {"name": "numeric", "params": {"lenient_fallback": True}}
    out = tmp_path / "e.json"
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["n_prompts"] == 4
    assert res.stdout.strip().startswith("4 prompts, k=4: ") and f"written: {out}" in res.stderr


@pytest.fixture
def busy_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def test_serve_and_view_on_a_port_in_use_fail_first_in_one_line(busy_port, monkeypatch, tmp_path):
    import gfcr.diagnose.viewer
    import gfcr.serve

    def boom(*a, **kw):
        raise AssertionError("loaded before the port was checked")

    monkeypatch.setattr(gfcr.serve, "serve", boom)
    monkeypatch.setattr(gfcr.diagnose.viewer, "create_app", boom)
    want = f"error: port {busy_port} on 127.0.0.1 is in use; pick another with --port"
    res = CliRunner().invoke(app, ["serve", "--port", str(busy_port)])
    assert res.exit_code == 2 and res.output.strip() == want, res.output
    res = CliRunner().invoke(app, ["view", str(tmp_path), "--port", str(busy_port)])
    assert res.exit_code == 2 and res.output.strip() == want, res.output  # no URL announced


def test_port_in_use_is_a_bind_test():
    import socket

    from gfcr.cli.common import port_in_use

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen(1)
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", 0)


@pytest.mark.timeout(180)
def test_ctrl_c_on_serve_exits_0_after_a_clean_shutdown(tmp_path):
    """SIGINT (Ctrl-C) on ``gfcr serve`` in a subprocess: it stops and exits 0, as the docs say (was 130)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from gfcr.serve import free_port
    from gfcr.testing import save_tiny

    model_dir = save_tiny(str(tmp_path / "tiny"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gfcr", "serve", "--model", model_dir, "--port", str(port)],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        log = proc.stdout.read().decode()
        assert rc == 0, log[-2000:]
        assert "Traceback" not in log and "KeyboardInterrupt" not in log
    finally:
        if proc.poll() is None:
            proc.kill()


def test_store_init_refuses_a_folder_of_dump_files(tmp_path):
    from gfcr.store.samples import write_verl

    dump = write_verl(tmp_path / "verl")
    before = sorted(p.name for p in dump.iterdir())
    res = CliRunner().invoke(app, ["store", "init", str(dump)])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"error: {dump} is not empty and is not a gfcr store (it holds ") and "new or empty folder" in line
    assert sorted(p.name for p in dump.iterdir()) == before  # nothing written: the dump still imports
    res = CliRunner().invoke(app, ["store", "import", str(tmp_path / "st"), str(dump), "--from", "verl", "--quiet"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["store", "import", str(dump), str(dump), "--from", "verl", "--quiet"])
    assert res.exit_code == 2 and "is not empty and is not a gfcr store" in res.output
    # an empty folder, a new path and an existing store are fine
    (tmp_path / "empty").mkdir()
    for p in (tmp_path / "empty", tmp_path / "new", tmp_path / "st"):
        assert CliRunner().invoke(app, ["store", "init", str(p)]).exit_code == 0


def test_a_run_folder_where_its_store_is_expected_says_did_you_mean(tmp_path):
    from gfcr.store import RolloutStore

    run = tmp_path / "runs" / "RUN"
    RolloutStore.open(run / "store", create=True)
    (run / "metrics.jsonl").write_text("")
    want = f"did you mean {run / 'store'}?"
    for cmd in (["store", "stats", str(run)], ["store", "check", str(run)], ["report", str(run), "--out", str(tmp_path / "r.html")],
                ["diagnose", str(run)], ["store", "init", str(run)]):
        res = CliRunner().invoke(app, cmd)
        assert res.exit_code == 2 and want in res.output and len(res.output.strip().splitlines()) == 1, (cmd, res.output)


def test_store_check_prints_one_line_per_table(tmp_path):
    from gfcr.store import RolloutStore
    from gfcr.store.core import TABLES
    from gfcr.testing import make_rollout

    s = RolloutStore.open(tmp_path / "st", create=True)
    s.append([make_rollout(i) for i in range(5)])
    res = CliRunner().invoke(app, ["store", "check", str(s.path)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == len(TABLES) + 1, res.output  # a line per table, ok
    assert lines[0].startswith("rollouts  v") and "5 rows, all readable" in lines[0] and "none damaged" in lines[0]
    assert lines[-1] == f"ok: {s.path} verified"


@pytest.fixture
def small_store(tmp_path):
    from gfcr.store import RolloutStore
    from gfcr.testing import make_rollout

    s = RolloutStore.open(tmp_path / "st", create=True)
    s.append([make_rollout(i) for i in range(4)])
    return s


def test_tokenizer_default_means_the_default_model(small_store, monkeypatch, tmp_path):
    import gfcr.models
    from gfcr.testing import save_tiny

    tiny = save_tiny(str(tmp_path / "tiny"))
    monkeypatch.setattr(gfcr.models, "pull_default", lambda *a, **kw: tmp_path / "tiny")
    assert gfcr.models.load_tokenizer("default").name_or_path == tiny
    res = CliRunner().invoke(app, ["diagnose", str(small_store.path), "--tokenizer", "default", "--json"])
    assert res.exit_code == 0, res.output
    assert "token_text_mismatch" not in json.loads(res.stdout)["health"]["skipped"]  # the check ran, decoded


@pytest.mark.parametrize("offline", ["env", "unreachable"])
def test_an_uncached_hub_tokenizer_offline_fails_fast_in_one_line(small_store, monkeypatch, offline):
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if offline == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        why = "HF_HUB_OFFLINE is set"
    else:
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
        why = "cannot connect to 127.0.0.1:9"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["diagnose", str(small_store.path), "--tokenizer", "no-such-org/no-such-tokenizer"])
    assert time.monotonic() - t0 < 10  # transformers alone retried for 28-52 s
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith("error: --tokenizer 'no-such-org/no-such-tokenizer': tokenizer") and why in line, line


def test_engine_override_drops_the_other_engines_args(tmp_path, capsys):
    from pathlib import Path

    from gfcr.cli.common import foreign_engine_args, generate_config
    from gfcr.generate.engines import make_engine

    assert foreign_engine_args("openai", {"device": "cpu", "max_batch": 32, "timeout_s": 9, "api_key_env": "K"}) == \
        ["device", "max_batch"]
    shipped = Path(__file__).resolve().parents[1] / "configs" / "generate-arith.yaml"
    cfg = generate_config(shipped, store=str(tmp_path / "st"), engine="openai", base_url="http://127.0.0.1:9/v1")
    assert cfg.engine.name == "openai" and cfg.engine.params == {"base_url": "http://127.0.0.1:9/v1"}
    err = capsys.readouterr().err
    assert "note: --engine openai: dropped the config's hf engine params device, max_batch" in err
    make_engine(cfg.engine.name, model="default", **cfg.engine.params)  # builds (it failed on device=)
    # the config's own engine keeps its params
    cfg = generate_config(shipped, store=str(tmp_path / "st"), engine="hf")
    assert cfg.engine.params == {"device": "cpu", "max_batch": 32}


@pytest.mark.timeout(120)
def test_ctrl_c_on_view_exits_0(small_store):
    """SIGINT on ``gfcr view`` in a subprocess: a clean stop, exit 0 (a guard: serve exited 130)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from gfcr.serve import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gfcr", "view", str(small_store.path), "--port", str(port)],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/summary", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() - t0 < 60, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
        log = proc.stdout.read().decode()
        assert rc == 0 and "Traceback" not in log, log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
