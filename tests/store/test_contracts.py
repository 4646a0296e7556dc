"""Contract tests: dumps written by each framework's own writer code (tests/contracts/gen_*.py;
fixtures committed under tests/contracts/fixtures) import with the values the framework meant.
Each assertion names a value an importer once got wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gfcr.formats import ImportFormatError, import_rollouts

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"


def _by(rs, key):
    return {key(r): r for r in rs}


# --- TRL (trl 1.16.0 GRPOTrainer(log_completions=True)) -----------------------------------------------


def test_trl_rewards_weights_extras_and_tool_turns(store):
    exp = json.loads((FIX / "trl" / "expected.json").read_text())["rows"]
    with pytest.raises(ImportFormatError, match="--reward-columns"):  # n_chars is numeric: never guessed
        import_rollouts(store, "trl", [str(FIX / "trl")])
    assert store.count() == 0
    res = import_rollouts(store, "trl", [str(FIX / "trl")], run_id="t", reward_columns=["accuracy_reward", "format_reward"],
                          reward_weights=[1.0, 0.5], verdict_key="accuracy_reward")
    assert res.written == len(exp) == 8
    got = _by(store.rollouts(run="t"), lambda r: (r.meta["file"], r.meta["row"]))
    for e in exp:
        r = got[(e["file"], e["row"])]
        assert r.reward == pytest.approx(e["reward"], abs=1e-9)  # TRL's nansum(weight * reward), extras not summed
        assert r.signals["advantage"] == pytest.approx(e["advantage"])
        assert r.signals["n_chars"] == e["n_chars"] and r.meta["extra"]["pred"] == e["pred"]  # kept, named
        assert [m.role for m in r.messages] == ["user", *e["roles"]]  # tool output stays a tool turn
        assert r.finish_reason is None  # TRL does not record it
        # logged after the update of the step that sampled it: file completions_00001 holds step 0's batch
        assert r.step == int(e["file"][12:17]) - 1 and r.policy_version == f"step-{r.step}"
        assert r.verified == (r.signals["reward/accuracy_reward"] > 0)
    tool = next(r for r in got.values() if len(r.messages) == 4)
    assert json.loads(tool.messages[1].tool_calls)[0]["function"]["name"] == "add"
    assert tool.messages[2].content.isdigit() and "answer" in tool.messages[3].content
    # format_reward returned None (NaN) for the 4 + 5 prompt: not applicable, not 0 and not in signals
    nine = [r for r in got.values() if "4 + 5" in r.messages[0].content]
    assert nine and all("reward/format_reward" not in r.signals for r in nine)
    # groups: the two generations of one prompt in one step
    groups = store.sql("SELECT group_id, count(*) n FROM rollouts GROUP BY group_id").to_pylist()
    assert len(groups) == 4 and {g["n"] for g in groups} == {2}


def test_trl_generation_reuse_is_stored_once_at_its_sampling_step(store):
    """num_iterations=2: TRL wrote each generation batch at two logging steps (8 generated, 16 rows
    logged) and gfcr stored all 16; the sampling step was the log step, one late."""
    exp = json.loads((FIX / "trl_reuse" / "expected.json").read_text())
    gens = exp["generations"]
    res = import_rollouts(store, "trl", [str(FIX / "trl_reuse")], run_id="t")
    rs = store.rollouts(run="t")
    generated = [(g["global_step"], c) for g in gens for c in g["completions"]]
    assert len(rs) == res.written == len(generated) == 8
    assert sorted((r.step, r.messages[-1].content) for r in rs) == sorted(generated)
    assert {r.policy_version for r in rs} == {f"step-{g['global_step']}" for g in gens} == {"step-0", "step-2"}
    assert "logged again" in " ".join(res.notes)
    again = import_rollouts(store, "trl", [str(FIX / "trl_reuse")], run_id="t")
    assert again.written == 0 and store.count() == 8


def test_trl_relogged_file_alone_adds_nothing(store, tmp_path):
    """Importing the later file of a repeated pair (e.g. a --follow that saw _00001 earlier) still
    recognises its rows as the ones already logged, by the previous file beside it."""
    src = FIX / "trl_reuse" / "completions"
    d = tmp_path / "completions"
    d.mkdir()
    for n in ("completions_00001.parquet", "completions_00002.parquet", "completions_00003.parquet"):
        shutil.copy(src / n, d / n)
    shutil.copy(src.parent / "training_args.bin", tmp_path / "training_args.bin")  # the run's GRPOConfig
    import_rollouts(store, "trl", [str(d / "completions_00001.parquet")], run_id="t")
    res = import_rollouts(store, "trl", [str(d / "completions_00002.parquet"), str(d / "completions_00003.parquet")],
                          run_id="t")
    assert res.written == 4 and store.count() == 8 and {r.step for r in res.rollouts} == {2}


def test_trl_string_step_of_older_versions(store, tmp_path):
    """TRL before 0.28 logged ``step`` as a string; the column is rewritten that way from the fixture."""
    d = tmp_path / "completions"
    d.mkdir()
    for f in sorted((FIX / "trl" / "completions").glob("*.parquet")):
        t = pq.read_table(f)
        t = t.set_column(0, "step", t.column("step").cast("string"))
        pq.write_table(t, d / f.name)
    res = import_rollouts(store, "trl", [str(d)], reward_columns=["accuracy_reward", "format_reward"])
    assert sorted({r.step for r in res.rollouts}) == [0, 1]


# --- prime-rl / verifiers v1 --------------------------------------------------------------------------


def test_prime_rl_episodes(store):
    exp = json.loads((FIX / "prime_rl" / "expected.json").read_text())
    res = import_rollouts(store, "prime-rl", [str(FIX / "prime_rl")], run_id="p")
    train = store.rollouts(run="p")
    # A (1 trace), B (1 trace), C (1 trace, 2 branches): once each although all/ and effective/ hold them
    assert len(train) == 4 and res.written == 5  # + 1 eval episode in its own run
    ev = store.rollouts(run="p-eval")
    assert len(ev) == 1 and ev[0].step == 3
    for r in train:
        assert r.step == 3 and r.meta["batch_step"] == 4  # run.work.step, not the folder and not 0
    by_reward = sorted(train, key=lambda r: r.reward)
    b, a = by_reward[0], by_reward[-1]
    assert a.reward == pytest.approx(exp["a"]["reward"])  # sum of score * weight (1 + 0.5 * 0.2)
    assert a.signals["reward/format"] == 0.5 and a.signals["metric/turns"] == 1.0
    assert a.signals["advantage"] == pytest.approx(exp["a"]["advantage"])  # from effective/, not dropped
    assert b.signals["advantage"] == pytest.approx(exp["b"]["advantage"])
    assert a.policy_version == "v2-v3" and b.policy_version == "v3"
    assert a.group_id == b.group_id == "p/prime-g1"  # the run is part of the group id
    assert a.finish_reason == "stop" and b.finish_reason == "length"
    # roles nest under node["message"]; tool turns keep their role, call and name
    assert [m.role for m in a.messages] == ["system", "user", "assistant"]
    assert [m.role for m in b.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(b.messages[2].tool_calls)[0]["name"] == "add" and b.messages[3].content == "5"
    # log-probs cover only the mask=True tokens; they land exactly there
    assert a.token_ids.tolist() == [1, 10, 11, 2, 1, 12, 13, 14, 2, 1, 15, 40, 41, 2]
    assert a.token_role.tolist() == [0] * 11 + [1] * 3
    assert a.logprobs[-3:].tolist() == [-0.5, -0.25, -0.125] and not a.logprobs[:11].any()
    assert b.token_role.tolist() == [0] * 9 + [0, 0, 1, 1, 1, 1] + [0] * 4 + [0, 0, 1, 1]
    # C: two leaves of one trace graph, two rollouts sharing the prompt; never trained (zero advantage)
    c = [r for r in train if r.group_id == "p/prime-g2"]
    assert len(c) == exp["c"]["branches"] and {r.messages[-1].content for r in c} == {"8", "9"}
    assert all(r.meta["subset"] == "all" and "advantage" not in r.signals for r in c)
    assert "without traces" in " ".join(res.notes)


def test_prime_rl_follow_order_all_then_effective(store, tmp_path):
    """A follower sees all/ first (no advantages yet); the effective/ copy then replaces it."""
    src = FIX / "prime_rl" / "rollouts"
    dst = tmp_path / "rollouts"
    shutil.copytree(src / "step_4" / "train" / "all", dst / "step_4" / "train" / "all")
    import_rollouts(store, "prime-rl", [str(tmp_path)], run_id="p")
    assert all("advantage" not in r.signals for r in store.rollouts(run="p"))
    shutil.copytree(src / "step_4" / "train" / "effective", dst / "step_4" / "train" / "effective")
    res = import_rollouts(store, "prime-rl", [str(tmp_path)], run_id="p")
    rs = store.rollouts(run="p")
    assert res.written == 0 and len(rs) == 4
    assert sum("advantage" in r.signals for r in rs) == 2  # A and B now carry their credit


# --- slime ------------------------------------------------------------------------------------------


def test_slime_reward_key_eval_remove_sample_versions(store):
    exp = json.loads((FIX / "slime" / "expected.json").read_text())
    with pytest.raises(ImportFormatError, match="--reward-key") as e:
        import_rollouts(store, "slime", [str(FIX / "slime")])
    assert "10.pt" in str(e.value) and "sample 0" in str(e.value)
    res = import_rollouts(store, "slime", [str(FIX / "slime")], run_id="s", reward_key="score")
    rs = sorted(store.rollouts(run="s"), key=lambda r: r.sample_index)
    assert [r.reward for r in rs] == exp["rewards"]
    assert [r.finish_reason for r in rs] == exp["finish"]
    assert [r.policy_version for r in rs] == exp["policy_version"]  # 9 before 10: numbers, not strings
    assert [r.meta["remove_sample"] for r in rs] == exp["remove_sample"]
    assert rs[0].signals["reward/format"] == 0.5 and all(r.step == 10 for r in rs)
    assert rs[1].token_role.tolist()[-5:] == [1, 1, 0, 0, 1]  # tool output in the response stays context
    assert len({r.group_id for r in rs}) == 2
    ev = store.rollouts(run="s-eval")
    assert len(ev) == 1 and ev[0].meta["eval"]  # eval_10.pt is its own run, not merged into the groups
    assert "remove_sample" in " ".join(res.notes)
    other = import_rollouts(store, "slime", [str(FIX / "slime")], run_id="s2", reward_key="score", evals="skip")
    assert other.written == 4 and store.count(where="run_id = 's2-eval'") == 0


# --- AReaL ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1.0.4", "cbff54d6"])
def test_areal_versions_special_tokens_eval(store, version):
    root = FIX / "areal" / version / "logs" / "root" / "exp" / "t1"
    res = import_rollouts(store, "areal", [str(root)], run_id="a")
    rs = sorted(store.rollouts(run="a"), key=lambda r: (r.meta["task_id"], r.sample_index))
    assert len(rs) == 3 and res.written == 4
    assert store.count(where="run_id = 'a-eval'") == 1  # eval-rollout/ is not mixed into training
    for r in rs:
        assert "-1" not in r.policy_version  # prompt tokens carry version -1: never a head version
        assert all("<|" not in m.content for m in r.messages)  # special tokens stripped from text
        assert r.step == 3 and r.finish_reason is None and r.verified is None
    if version == "cbff54d6":  # version_rle: exact head over generated tokens
        assert [r.policy_version for r in rs] == ["v3", "v2-v3", "v3"]
    else:  # 1.0.4 wrote head_version = -1 (prompt included) and no rle: the head is unknown
        assert [r.policy_version for r in rs] == ["v?-v3"] * 3
    assert [m.role for m in rs[0].messages] == ["user", "assistant"]
    assert rs[0].messages[0].content == "What is 2 + 3?" and rs[0].messages[1].content == "The answer is 5."
    tool = rs[2]
    assert [m.role for m in tool.messages] == ["user", "assistant", "tool", "assistant"]
    assert tool.messages[2].content == "42" and tool.messages[3].content == "So the answer is 42."
    assert rs[0].group_id == rs[1].group_id != rs[2].group_id
    skip = import_rollouts(store, "areal", [str(root)], run_id="b", evals="skip")
    assert skip.written == 3


def test_areal_special_tokens_kept_in_tokens(store, tmp_path):
    from gfcr.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    root = FIX / "areal" / "cbff54d6" / "logs" / "root" / "exp" / "t1" / "rollout"
    res = import_rollouts(store, "areal", [str(root)], tokenizer=tok)
    r = min(res.rollouts, key=lambda x: (x.meta["task_id"], x.sample_index))
    assert tok.convert_tokens_to_ids("<|im_end|>") in r.token_ids.tolist()  # tokens untouched
    assert "<|im_end|>" not in r.messages[-1].content


# --- verl -------------------------------------------------------------------------------------------


def test_verl_acc_is_the_verdict(store):
    import_rollouts(store, "verl", [str(FIX / "verl")], run_id="v")
    rs = store.rollouts(run="v")
    assert len(rs) == 8
    assert store.count(where="verified") == 4  # the documented `--where verified` selects the correct ones
    for r in rs:
        assert r.finish_reason is None  # not recorded by verl
        assert r.verified == ("5" in r.messages[1].content.split("{")[-1] or "42}" in r.messages[1].content
                              or r.messages[1].content in ("#### 5", "#### 42"))
    s1 = [r for r in rs if r.step == 1]
    assert {r.reward for r in s1} == {1.0, -1.0} and all(r.meta["extra"]["pred"] for r in s1)
    assert all(r.meta["request_id"].startswith("req-") for r in s1)
    assert {p.answer for p in store.prompts(task="verl")} == {"5", "42"}
    assert len({r.group_id for r in rs}) == 4


# --- SkyRL: integer ranges ----------------------------------------------------------------------------


def test_skyrl_token_id_beyond_int32_refused(store, tmp_path):
    """A token id of 2^32 + 5 used to be stored as 5 with exit 0."""
    from test_importers_roll_skyrl import _tensors, write_skyrl

    t = _tensors()
    t["sequences"][1, -1] = 2**32 + 5
    d = tmp_path / "dumped_data"
    write_skyrl(d / "global_step_3_training_input.pkl", t, {})
    with pytest.raises(ImportFormatError, match=r"4294967301 .*out of range") as e:
        import_rollouts(store, "skyrl", [str(d)], trust_pickle=True)
    assert "global_step_3_training_input.pkl" in str(e.value) and "field 'sequences'" in str(e.value)
    assert store.count() == 0
    t["sequences"][1, -1] = 300
    write_skyrl(d / "global_step_3_training_input.pkl", t, {})
    with pytest.raises(ImportFormatError, match="vocabulary size 256"):
        import_rollouts(store, "skyrl", [str(d)], trust_pickle=True, vocab=256)


# --- open-instruct save_traces ------------------------------------------------------------------------


def test_open_instruct_save_traces(store):
    from gfcr.testing import tiny_tokenizer

    res = import_rollouts(store, "open-instruct", [str(FIX / "open_instruct")], run_id="oi")
    assert res.written == 4 and res.files == [str(FIX / "open_instruct" / "grpo_demo_rollouts_000000.jsonl")]
    rs = sorted(store.rollouts(run="oi"), key=lambda r: r.meta["sample_idx"])
    assert [r.reward for r in rs] == [10.0, 0.0, 10.0, 0.0]
    assert [r.signals["advantage"] for r in rs] == [0.5, -0.5, 0.5, -0.5]
    assert [r.finish_reason for r in rs] == ["stop", "stop", "stop", "length"]
    assert all(r.step == 7 and r.tokens_source == "engine" for r in rs)
    assert rs[0].token_ids.tolist() == [1, 50, 51, 2, 70, 71, 2] and rs[0].token_role.tolist() == [0] * 4 + [1] * 3
    assert rs[1].logprobs[4:].tolist() == [-0.25, -0.5, -0.75, -1.0, -1.25]
    assert rs[1].meta["tool_called"] and not rs[0].meta["tool_called"]
    assert rs[0].meta["run"]["model_name"] == "tiny-model"
    assert rs[0].group_id == rs[1].group_id != rs[2].group_id
    assert {p.answer for p in store.prompts()} == {"5", "42"}
    dec = import_rollouts(store, "open-instruct", [str(FIX / "open_instruct")], run_id="oi2", tokenizer=tiny_tokenizer())
    assert all(len(r.messages) == 2 for r in dec.rollouts)


def test_open_instruct_groups_are_per_run_and_sample_index_is_within_the_group(store, tmp_path):
    """Two runs share open-instruct's default save folder: group_id was oi-{step}-{prompt_idx}, so
    their groups merged (even with --run), and sample_index was the batch position (2, 3)."""
    d = tmp_path / "rollouts"
    shutil.copytree(FIX / "open_instruct", d)
    other = (d / "grpo_demo_rollouts_000000.jsonl").read_text().replace('"reward": 10.0', '"reward": 9.0')
    (d / "grpo_other_rollouts_000000.jsonl").write_text(other)
    import_rollouts(store, "open-instruct", [str(d)])  # no --run: both runs' files in one import
    groups = store.sql("SELECT group_id, count(*) n FROM rollouts GROUP BY group_id").to_pylist()
    assert len(groups) == 4 and {g["n"] for g in groups} == {2}
    rs = store.rollouts()
    assert sorted(r.sample_index for r in rs) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sorted(r.meta["sample_idx"] for r in rs if "other" in r.meta["file"]) == [0, 1, 2, 3]
    a = import_rollouts(store, "open-instruct", [str(FIX / "open_instruct")], run_id="a")
    b = import_rollouts(store, "open-instruct", [str(FIX / "open_instruct")], run_id="b")
    assert not {r.group_id for r in a.rollouts} & {r.group_id for r in b.rollouts}


# --- audit: ids never collide across runs ---------------------------------------------------------


@pytest.mark.parametrize(("fmt", "path", "kw"), [
    ("trl", "trl", {"reward_columns": ["accuracy_reward", "format_reward"]}),
    ("verl", "verl", {}),
    ("prime-rl", "prime_rl", {}),
    ("slime", "slime", {"reward_key": "score"}),
    ("areal", "areal/cbff54d6/logs/root/exp/t1", {}),
    ("open-instruct", "open_instruct", {}),
    ("atropos", "atropos/groups.jsonl", {}),
    ("atif", "atif/trajectory.json", {}),
    ("nemo-gym", "nemo_gym", {}),
    ("art", "art", {}),
])
def test_the_same_dump_under_two_runs_shares_no_rollout_or_group_id(store, fmt, path, kw):
    """group_id was built from prompt and step alone (verl, TRL, prime-rl, slime, AReaL, ...): two
    runs' groups merged in every group query (GROUP BY group_id, group advantages, Control)."""
    a = import_rollouts(store, fmt, [str(FIX / path)], run_id="a", **kw)
    b = import_rollouts(store, fmt, [str(FIX / path)], run_id="b", **kw)
    assert a.written == b.written > 0
    assert not {r.rollout_id for r in a.rollouts} & {r.rollout_id for r in b.rollouts}
    assert not {r.group_id for r in a.rollouts} & {r.group_id for r in b.rollouts}


def test_unscored_rows_have_a_null_reward(store, tmp_path):
    """A TRL row no reward function scored (all NaN: TRL logs its reward as NaN) and a prime-rl trace
    with no scores were stored with reward 0.0, an invented score."""
    d = tmp_path / "completions"
    d.mkdir()
    t = pq.read_table(FIX / "trl" / "completions" / "completions_00001.parquet")
    nan = [float("nan")] * t.num_rows
    for c in ("accuracy_reward", "format_reward"):
        t = t.set_column(t.column_names.index(c), c, pa.array(nan, pa.float64()))
    pq.write_table(t, d / "completions_00001.parquet")
    res = import_rollouts(store, "trl", [str(d)], run_id="t", reward_columns=["accuracy_reward", "format_reward"])
    assert res.written == t.num_rows and all(r.reward is None for r in store.rollouts(run="t"))
    root = tmp_path / "p" / "rollouts" / "step_4" / "train" / "effective"
    root.mkdir(parents=True)
    src = FIX / "prime_rl" / "rollouts" / "step_4" / "train" / "effective" / "traces.jsonl"
    ep = json.loads(src.read_text().splitlines()[0])
    ep["traces"][0]["rewards"] = {}
    (root / "traces.jsonl").write_text(json.dumps(ep) + "\n")
    res = import_rollouts(store, "prime-rl", [str(tmp_path / "p")], run_id="p")
    assert [r.reward for r in res.rollouts] == [None]


# --- Atropos scored groups (data_path_to_save_groups) ---------------------------------------------------


def test_atropos_scored_groups(store):
    res = import_rollouts(store, "atropos", [str(FIX / "atropos" / "groups.jsonl")], run_id="at")
    rs = sorted(store.rollouts(run="at"), key=lambda r: (r.meta["line"], r.sample_index))
    assert res.written == 3 and [r.reward for r in rs] == [1.0, -1.0, 0.5]
    a, b, c = rs
    assert a.token_ids.tolist() == [1, 10, 11, 12, 2, 20, 21, 2] and a.token_role.tolist() == [0] * 5 + [1] * 3
    # log-prob 1.0 is Atropos's placeholder on prompt positions: stored as 0 there, never as a log-prob
    assert a.logprobs.tolist() == [0.0] * 5 + [-0.5, -0.25, -0.125]
    assert a.signals["advantage"] == 1.0 and b.signals["advantage"] == -1.0
    assert (a.finish_reason, b.finish_reason, c.finish_reason) == ("stop", "length", None)
    assert a.group_id == b.group_id != c.group_id and [a.sample_index, b.sample_index] == [0, 1]
    assert [m.role for m in a.messages] == ["user", "assistant"] and a.sampling == {"temperature": 1.0}
    # multi-turn extension: the earlier completion stays generated, the tool reply is context
    assert c.token_role.tolist() == [0] * 5 + [1, 1] + [0, 0, 0] + [1, 1]
    assert c.logprobs.tolist()[5:7] == [-0.5, -0.5] and not c.logprobs[7:10].any()
    assert all(r.step == 0 and not r.meta["step_in_dump"] and r.policy_version == "unknown" for r in rs)


def test_atropos_mask_must_be_the_token_or_minus_100(store, tmp_path):
    g = json.loads((FIX / "atropos" / "groups.jsonl").read_text().splitlines()[0])
    g["masks"][1][6] = 999
    (tmp_path / "g.jsonl").write_text(json.dumps(g) + "\n")
    with pytest.raises(ImportFormatError, match=r"line 1 sample 1: field 'masks\[6\]'"):
        import_rollouts(store, "atropos", [str(tmp_path / "g.jsonl")], run_id="x")
    assert store.count() == 0
