"""Contract tests, round 4 (issue 48): real job folders and the values each writer meant. The
fixtures come from the frameworks' own writer code (tests/contracts/gen_*.py); each test names a
value or a refusal gfcr once got wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gfcr.formats import import_rollouts

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"


def gfcr(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


# --- TRL: a collapsed policy is not generation reuse; two runs under one parent ------------------------


def test_trl_collapsed_policy_keeps_every_rollout(store):
    """num_iterations=1, identical completions, rewards and zero advantages at consecutive steps: TRL
    generated 12 rollouts (expected.json, recorded inside TRL); gfcr kept 4 and blamed num_iterations."""
    exp = json.loads((FIX / "trl_collapse" / "expected.json").read_text())
    assert exp["num_iterations"] == 1
    res = import_rollouts(store, "trl", [str(FIX / "trl_collapse")], run_id="c")
    generated = sorted((g["global_step"], c) for g in exp["generations"] for c in g["completions"])
    rs = store.rollouts(run="c")
    assert res.written == len(rs) == len(generated) == 12
    assert sorted((r.step, r.messages[-1].content) for r in rs) == generated
    assert all(r.signals["advantage"] == 0.0 for r in rs)
    assert not any("logged again" in n for n in res.notes)


def test_trl_reuse_is_read_from_the_config_never_from_content(store, tmp_path):
    """Without the run's training_args.bin, rows equal to the previous file's are kept (and said so):
    equal content alone never drops a rollout. With it (the reuse fixture), the re-logged batches go."""
    d = tmp_path / "out" / "completions"
    shutil.copytree(FIX / "trl_reuse" / "completions", d)
    res = import_rollouts(store, "trl", [str(d.parent)], run_id="noconf")
    assert res.written == 16 and any("never drops rows by content alone" in n for n in res.notes)
    shutil.copy(FIX / "trl_reuse" / "training_args.bin", d.parent / "training_args.bin")
    res = import_rollouts(store, "trl", [str(d.parent)], run_id="conf")
    assert res.written == 8 and any("training_args.bin" in n and "logged again" in n for n in res.notes)


def test_trl_two_runs_under_one_parent_share_no_group(store, tmp_path):
    """Two runs' output folders under one parent, one --run: the group id ignored the folder, so the
    same prompt at the same step in both runs made one group of 4."""
    for name in ("seed-1", "seed-2"):
        shutil.copytree(FIX / "trl_collapse", tmp_path / "runs" / name)
    res = import_rollouts(store, "trl", [str(tmp_path / "runs")], run_id="both")
    assert res.written == 24
    groups = store.sql("SELECT group_id, count(*) AS n FROM rollouts GROUP BY group_id").to_pylist()
    assert len(groups) == 12 and {g["n"] for g in groups} == {2}
    assert {g["group_id"].split("/")[1] for g in groups} == {"seed-1", "seed-2"}
    assert all(g["group_id"].startswith("both/seed-") for g in groups)
    assert {r.meta["file"].split("/")[0] for r in store.rollouts(run="both")} == {"seed-1", "seed-2"}


def test_trl_single_folder_ids_unchanged(store):
    """Pointing at output_dir or at its completions/ folder gives the ids of before (no scope)."""
    a = import_rollouts(store, "trl", [str(FIX / "trl_collapse")], run_id="s")
    again = import_rollouts(store, "trl", [str(FIX / "trl_collapse" / "completions")], run_id="s")
    assert a.written == 12 and again.written == 0 and again.skipped == 12
    assert all(r.group_id == f"s/{r.prompt_id}@{r.step}" for r in a.rollouts)  # as before
    r = next(r for r in a.rollouts if r.meta["row"] == 0 and r.meta["file"] == "completions_00001.parquet")
    from gfcr.formats._common import hid

    ptext = r.messages[0].content
    assert r.rollout_id == "trl-" + hid("s", "completions_00001.parquet", 0, ptext,
                                        json.dumps([m.to_dict() for m in r.messages[1:]]))


def test_cli_imports_a_collapsed_trl_run(tmp_path):
    st = tmp_path / "st"
    gfcr("store", "init", st)
    out = gfcr("store", "import", st, FIX / "trl_collapse", "--from", "trl", "--run", "c").stdout
    assert "imported 12 new rollouts" in out and "logged again" not in out
    q = gfcr("store", "query", st, "SELECT step, count(*) AS n FROM rollouts GROUP BY step ORDER BY step", "--json")
    assert [json.loads(x) for x in q.stdout.splitlines()] == [{"step": s, "n": 4} for s in (0, 1, 2)]


# --- verl: two experiments under one parent ------------------------------------------------------------


@pytest.mark.parametrize("columnar", [True, False])
def test_verl_two_experiments_whose_files_share_names(store, tmp_path, columnar):
    """Two experiments' rollout_data_dir folders (verl's own writer; same file names, identical rows)
    under one parent were refused: "duplicate rollout_id within the batch" (ids hashed the base name)."""
    for name in ("exp-a", "exp-b"):
        shutil.copytree(FIX / "verl", tmp_path / "dump" / name)
    res = import_rollouts(store, "verl", [str(tmp_path / "dump")], run_id="v", columnar=columnar)
    assert res.written == store.count() == 16
    groups = store.sql("SELECT group_id, count(*) AS n FROM rollouts GROUP BY group_id").to_pylist()
    assert len(groups) == 8 and {g["n"] for g in groups} == {2}
    assert {r.meta["file"] for r in store.rollouts(run="v")} == {f"exp-{x}/{n}.jsonl" for x in "ab" for n in (1, 2)}
    again = import_rollouts(store, "verl", [str(tmp_path / "dump")], run_id="v", columnar=columnar)
    assert again.written == 0 and store.count() == 16


def test_verl_single_folder_ids_unchanged_and_paths_agree(store, tmp_path):
    """A dump folder imported directly keeps its ids (no scope); the columnar and the row path agree."""
    a = import_rollouts(store, "verl", [str(FIX / "verl")], run_id="v")
    b = import_rollouts(store, "verl", [str(FIX / "verl")], run_id="v", columnar=False)
    assert a.written == 8 and b.written == 0 and b.skipped == 8
    assert all(r.group_id == f"v/{r.prompt_id}@{r.step}" for r in store.rollouts(run="v"))  # as before
    from gfcr.formats._common import hid

    r = next(r for r in store.rollouts(run="v") if r.meta["file"] == "1.jsonl" and r.meta["line"] == 1)
    assert r.rollout_id == "verl-" + hid("v", "1.jsonl", 1, r.messages[0].content if len(r.messages) == 2
                                         else r.meta["prompt_text"], r.messages[-1].content)


# --- verl: the templated prompt split back into turns; lengths of text-only rows -----------------------


@pytest.mark.parametrize("columnar", [True, False])
def test_verl_templated_prompt_split_into_turns(store, tmp_path, columnar):
    """verl logs ``input`` after the chat template: gfcr stored it as one user turn (the viewer showed
    ``<|im_start|>user``, and a messages export was templated twice)."""
    exp = json.loads((FIX / "verl_jobs" / "expected.json").read_text())["turns"]
    res = import_rollouts(store, "verl", [str(FIX / "verl_jobs")], run_id="v", columnar=columnar)
    assert res.written == 8
    for r in store.rollouts(run="v"):
        exp_name = r.meta["file"].split("/")[0]
        turns = [[m.role, m.content] for m in r.messages[:-1]]
        assert turns in exp[exp_name]  # system/user turns exactly as the conversation held them
        assert r.messages[-1].role == "assistant" and "<|" not in r.messages[-1].content
        assert r.meta["prompt_format"] in ("chatml", "llama3")
        assert r.meta["length_unit"] == "chars" and r.cost.gen_tokens == len(r.messages[-1].content) > 0
    assert {tuple(m.role for m in p.messages) for p in store.prompts(task="verl")} == {("system", "user"), ("user",)}


def test_verl_paths_agree_on_split_prompts(tmp_path):
    from gfcr.store import RolloutStore

    tables = []
    for columnar in (True, False):
        s = RolloutStore.open(tmp_path / f"s{columnar}", create=True)
        import_rollouts(s, "verl", [str(FIX / "verl_jobs")], run_id="v", columnar=columnar)
        t = s.sql("SELECT rollout_id, group_id, messages, cost, meta FROM rollouts ORDER BY rollout_id").to_pylist()
        tables.append(t)
    assert tables[0] == tables[1]


def test_verl_unrecognised_template_kept_verbatim_and_never_retemplated(store, tmp_path):
    """Qwen's ChatML with its special tokens decoded away (``user\\n…\\nassistant\\n``, the verl fixture)
    cannot be split safely: kept as one turn, marked, warned about; the SFT text export skips it."""
    from gfcr.formats.sft_export import export_sft

    res = import_rollouts(store, "verl", [str(FIX / "verl")], run_id="v")
    assert any("warning" in n and "templated" in n for n in res.notes)
    rs = store.rollouts(run="v")
    assert all(r.meta["prompt_format"] == "templated" and len(r.messages) == 2 for r in rs)
    import_rollouts(store, "verl", [str(FIX / "verl_jobs")], run_id="w")
    out = export_sft(store, tmp_path / "m.parquet", "messages")
    assert out["rows"] + out["duplicates_dropped"] == 8 and out["skipped"] == {"templated_prompt": 8}
    import pyarrow.parquet as pq

    conv = pq.read_table(tmp_path / "m.parquet").column("messages").to_pylist()
    assert all("<|" not in m["content"] for c in conv for m in c)  # turns, never a template inside a turn


def test_trl_text_rows_get_character_lengths(store):
    """TRL text logs stored gen_tokens 0: length metrics were blind."""
    import_rollouts(store, "trl", [str(FIX / "trl_collapse")], run_id="c")
    for r in store.rollouts(run="c"):
        assert r.meta["length_unit"] == "chars" and r.cost.gen_tokens == len("It is 5.")
        assert r.cost.prompt_tokens == len(r.messages[0].content) and r.finish_reason is None  # TRL logs none


def test_cli_imports_a_two_experiment_verl_folder(tmp_path):
    st = tmp_path / "st"
    gfcr("store", "init", st)
    for name in ("exp-a", "exp-b"):
        shutil.copytree(FIX / "verl", tmp_path / "dump" / name)
    shutil.copytree(FIX / "verl_jobs", tmp_path / "dump" / "chat")
    out = gfcr("store", "import", st, tmp_path / "dump", "--from", "verl", "--run", "v").stdout
    assert "imported 24 new rollouts" in out
    q = gfcr("store", "query", st, "SELECT count(DISTINCT group_id) AS g, count(DISTINCT rollout_id) AS n FROM rollouts",
             "--json")
    assert json.loads(q.stdout.splitlines()[0]) == {"g": 13, "n": 24}  # 8 + 2 + 3 (exp-b's copied row has its own prompt)


# --- ATIF: a Harbor job folder (Harbor 0.26's own models and writer) ------------------------------------


def test_harbor_job_folder_imports_each_trajectory_once(store):
    """A job folder also holds config.json, result.json, verifier/reward.json, artifacts/manifest.json:
    every *.json was taken for a trajectory. A continued session (trajectory.json + trajectory.cont-1.json,
    one session_id) was refused as a duplicate, a root without session_id refused, content parts refused."""
    exp = json.loads((FIX / "harbor_job.expected.json").read_text())
    res = import_rollouts(store, "atif", [str(FIX / "harbor_job")], run_id="h")
    assert res.written == store.count() == exp["rollouts"] == 4
    skipped = [n for n in res.notes if n.startswith("skipped")]
    assert len(skipped) == 1 and "13 file(s)" in skipped[0] and "config.json" in skipped[0]
    rs = {r.meta["file"]: r for r in store.rollouts(run="h")}
    assert set(rs) == {"t1/agent/trajectory.json", "t2/agent/trajectory.json", "t2/agent/trajectory.cont-1.json",
                       "t3/agent/trajectory.json"}
    for f, r in rs.items():  # the trial's verifier reward, as Harbor's Verifier reads it
        assert r.reward == exp["rewards"][f.split("/")[0]]
    assert rs["t3/agent/trajectory.json"].signals == {"reward/reward": 1.0, "reward/style": 0.5}
    # the continuation: its own rollout, its copied context is context, its new step keeps its token ids
    cont = rs["t2/agent/trajectory.cont-1.json"]
    assert cont.meta["continuation_index"] == 1 and cont.meta["session_id"] == "sess-t2"
    assert cont.token_ids.tolist() == [1, 10, 2, 1, 11, 2, 50, 51, 60, 61]
    assert cont.token_role.tolist() == [0] * 8 + [1, 1] and cont.logprobs.tolist() == [0.0] * 8 + [-0.75, -0.5]
    assert cont.rollout_id != rs["t2/agent/trajectory.json"].rollout_id
    # no session_id (v1.7): imported, keyed by its path; content parts: text kept, the parts in meta
    t3 = rs["t3/agent/trajectory.json"]
    assert t3.meta["session_id"] is None and t3.messages[0].content == "What does the picture show?"
    assert [p["type"] for p in t3.meta["atif"]["steps"][0]["message_parts"]] == ["text", "image"]
    # the two trials of one task form one group (of this job: the job folder is the import root)
    t1, t2 = rs["t1/agent/trajectory.json"], rs["t2/agent/trajectory.json"]
    assert t1.group_id == t2.group_id == f"h/{t1.prompt_id}"
    again = import_rollouts(store, "atif", [str(FIX / "harbor_job")], run_id="h")
    assert again.written == 0 and store.count() == 4


def test_atif_lone_surrogate_names_file_and_field(store, tmp_path):
    """A lone surrogate (a JSON \\ud800 escape) ended in a bare UnicodeEncodeError naming no file."""
    import_rollouts(store, "atif", [str(FIX / "atif")], run_id="a")
    before = (store.count(), len(store.versions()))
    d = tmp_path / "job" / "t1" / "agent"
    d.mkdir(parents=True)
    text = (FIX / "harbor_job" / "t1" / "agent" / "trajectory.json").read_text()
    (d / "trajectory.json").write_text(text.replace('"What is 2 + 3?"', '"What is 2 \\ud800 3?"'))
    from gfcr.formats import ImportFormatError

    with pytest.raises(ImportFormatError, match=r"trajectory\.json: trajectory: field 'steps\[1\]\.message': lone surrogate"):
        import_rollouts(store, "atif", [str(tmp_path / "job")], run_id="a")
    assert (store.count(), len(store.versions())) == before


def test_cli_imports_a_harbor_job_folder(tmp_path):
    st = tmp_path / "st"
    gfcr("store", "init", st)
    out = gfcr("store", "import", st, FIX / "harbor_job", "--from", "atif", "--run", "h").stdout
    assert "imported 4 new rollouts" in out and "skipped 13 file(s)" in out
    q = gfcr("store", "query", st, "SELECT count(*) AS n, count(reward) AS scored FROM rollouts", "--json")
    assert json.loads(q.stdout.splitlines()[0]) == {"n": 4, "scored": 4}


def test_two_harbor_jobs_under_one_parent_keep_their_groups(store, tmp_path):
    """Two jobs (their own session ids) under one parent: the same task's trials stay in their job's group."""
    for name in ("job-1", "job-2"):
        shutil.copytree(FIX / "harbor_job", tmp_path / "jobs" / name)
        for f in (tmp_path / "jobs" / name).rglob("trajectory*.json"):
            f.write_text(f.read_text().replace('"sess-', f'"{name}-sess-'))
    res = import_rollouts(store, "atif", [str(tmp_path / "jobs")], run_id="h")
    assert res.written == 8
    groups = store.sql("SELECT group_id, count(*) AS n FROM rollouts GROUP BY group_id").to_pylist()
    assert sorted(g["n"] for g in groups) == [1, 1, 1, 1, 2, 2]
    assert {g["group_id"].split("/")[1] for g in groups} == {"job-1", "job-2"}


# --- ART 0.5.23 (its own write_trajectory_groups_parquet) ----------------------------------------------


def test_art_0523_sentinel_finish_reason_and_policy_versions(store):
    """A group whose every rollout raised is one sentinel row: it was stored as a rollout with no
    messages. finish_reason and the policy versions are in trajectory_json: stored null and step-N."""
    exp = json.loads((FIX / "art_0523" / "expected.json").read_text())
    res = import_rollouts(store, "art", [str(FIX / "art_0523")], run_id="a")
    assert res.written == store.count() == exp["rollouts"] == 4
    assert any("skipped 1 group(s) whose every rollout raised" in n for n in res.notes)
    rs = sorted(store.rollouts(run="a"), key=lambda r: (r.meta["group_index"], r.sample_index))
    assert all(r.messages for r in rs)
    assert [r.finish_reason for r in rs] == exp["finish"]
    assert [r.policy_version for r in rs] == exp["policy"]
    assert rs[1].meta["policy_versions"] == [4, 5]
    assert [[m.role, m.content] for m in rs[2].messages] == exp["exchange_messages"]  # messages column null
    assert rs[2].reward == 0.25 and rs[2].meta["trainable"] == [1] and rs[2].tokens_source == "none"
    # exact ids in the exchanges (vLLM's prompt_token_ids / token_ids): tokens and log-probs, two turns
    ex = rs[3]
    assert ex.tokens_source == "engine" and ex.token_ids.tolist() == exp["exact"]["token_ids"]
    assert ex.token_role.tolist() == exp["exact"]["token_role"]
    assert ex.logprobs.tolist() == pytest.approx(exp["exact"]["logprobs"]) and ex.meta["trainable"] == [1, 3]


def test_art_0518_layout_unchanged(store):
    """The older writer (no trajectory_json): finish reason null, policy version from the file name."""
    import_rollouts(store, "art", [str(FIX / "art")], run_id="o")
    rs = store.rollouts(run="o")
    assert rs and all(r.finish_reason is None and r.policy_version == "step-3" for r in rs)


# --- Atropos: ManagedServer's 1.0 padding of missing log-probs -----------------------------------------


def test_atropos_padded_logprobs_are_missing_not_refused(store):
    """ManagedServer pads log-probs the server did not return with 1.0: the file was refused
    ("a log-probability must be <= 0"). They are unknown: 0 in the array, counted and placed in meta."""
    exp = json.loads((FIX / "atropos_padded" / "expected.json").read_text())
    res = import_rollouts(store, "atropos", [str(FIX / "atropos_padded")], run_id="p")
    assert res.written == 2
    rs = sorted(store.rollouts(run="p"), key=lambda r: r.sample_index)
    assert [r.logprobs.tolist() for r in rs] == exp["logprobs"]
    assert [r.meta.get("logprobs_missing", 0) for r in rs] == exp["missing"]
    assert rs[1].meta["logprobs_missing_at"] == [5, 6] and rs[1].finish_reason == "length"


# --- prime-rl: left from the malformed-input suite ----------------------------------------------------


def _reindex(lines: list[str], index: Path) -> None:
    rows = [json.loads(x) for x in index.read_text().splitlines()]
    off = 0
    for r, line in zip(rows, lines, strict=True):
        r["offset"] = off
        off += len(line.encode()) + 1
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prime_rl_stream_annotation_longer_than_its_branch_refused(store, tmp_path):
    """A trainer annotation whose log-prob stream is longer than the branch's tokens was accepted
    (exit 0, the values cut): refused, one line naming the annotation file, row and stream."""
    d = tmp_path / "single"
    shutil.copytree(FIX / "prime_rl_stream" / "single", d)
    ann = d / "monitors" / "file" / "traces" / "annotations" / "trainer.jsonl"
    lines = ann.read_text().splitlines()
    o = json.loads(lines[0])
    o["branches"][0]["trainer_logprobs"] += [-0.1, -0.2]
    lines[0] = json.dumps(o, separators=(",", ":"))
    ann.write_text("".join(x + "\n" for x in lines))
    _reindex(lines, ann.with_name("trainer.index.jsonl"))
    from gfcr.formats import ImportFormatError

    with pytest.raises(ImportFormatError, match=r"trainer\.jsonl: row 1 .*field 'branches\[0\]\.trainer_logprobs': "
                                                r"16 values for the 14 tokens"):
        import_rollouts(store, "prime-rl-stream", [str(d)], run_id="x")
    assert store.count() == 0


@pytest.mark.parametrize("fmt", ["verl", "prime-rl"])
def test_json_nested_too_deeply_names_the_field(store, tmp_path, fmt):
    """"JSON nested too deeply" named field '-'."""
    from gfcr.formats import ImportFormatError

    deep = "[" * 5000 + "]" * 5000
    if fmt == "verl":
        f = tmp_path / "1.jsonl"
        f.write_text('{"input": "q", "output": "a", "score": 1.0, "step": 1, "meta_blob": ' + deep + "}\n")
    else:
        f = tmp_path / "rollouts" / "step_1" / "train" / "all" / "traces.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text('{"id": "e1", "info": ' + deep + ', "traces": []}\n')
    key = "meta_blob" if fmt == "verl" else "info"
    with pytest.raises(ImportFormatError, match=rf"line 1: field '{key}': JSON nested too deeply"):
        import_rollouts(store, fmt, [str(tmp_path)], run_id="x", columnar=False)


def test_verl_decoded_away_template_split_with_the_runs_tokenizer(store):
    """Qwen-style ChatML whose marks were special tokens (decoded away: ``user\\n…\\nassistant\\n``) is
    split when the tokenizer's own chat template renders the cut back to the very text."""
    from gfcr.testing import tiny_tokenizer

    res = import_rollouts(store, "verl", [str(FIX / "verl")], run_id="v", tokenizer=tiny_tokenizer())
    assert not any("warning" in n for n in res.notes)
    for r in store.rollouts(run="v"):
        assert r.meta["prompt_format"] == "chat_template" and [m.role for m in r.messages] == ["user", "assistant"]
        assert r.messages[0].content.startswith("What is ") and r.messages[0].content.endswith("\\boxed{}.")
        assert r.meta["length_unit"] == "tokens" and r.cost.gen_tokens == int(r.token_role.sum()) > 0


# --- RedNote Relax (slime-style .pt dumps) -------------------------------------------------------------


def test_relax_dump_through_the_slime_importer(store):
    """Relax's save_debug_rollout_data (slime's layout, Relax's Sample): a log-prob Relax marks as no
    longer matching its token (rollout_log_probs_mask False) is unknown, not a probability of 1."""
    exp = json.loads((FIX / "relax" / "expected.json").read_text())
    res = import_rollouts(store, "slime", [str(FIX / "relax")], run_id="rx")
    assert res.written == exp["train"] + exp["eval"]
    rs = sorted(store.rollouts(run="rx"), key=lambda r: r.sample_index)
    assert [r.finish_reason for r in rs] == exp["finish"] and [r.policy_version for r in rs] == exp["policy"]
    assert [r.logprobs.tolist() for r in rs] == exp["logprobs"]  # float32-exact values
    assert [r.meta.get("logprobs_missing_at", []) for r in rs] == exp["missing_at"]
    assert [r.reward for r in rs] == [1.0, -1.0] and len(store.rollouts(run="rx-eval")) == exp["eval"]


def test_follow_scopes_like_the_bulk_import(store, tmp_path):
    """--follow reads one file at a time: it must key ids by the same folder scope as a bulk import
    of the same parent, or the two would store every rollout twice."""
    from gfcr.formats import follow

    for name in ("exp-a", "exp-b"):
        shutil.copytree(FIX / "verl", tmp_path / "dump" / name)
    got = follow(store, "verl", [str(tmp_path / "dump")], run_id="v", interval=0.01, max_polls=1)
    assert got.written == store.count() == 16
    again = import_rollouts(store, "verl", [str(tmp_path / "dump")], run_id="v")
    assert again.written == 0 and store.count() == 16
