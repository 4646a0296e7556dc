"""ROLL (text JSONL) and SkyRL (pickled TrainingInputBatch) importers.

SkyRL is not installed here, so the tests write its pickles with stand-in classes that mimic the
attribute layout of ``skyrl.backends.skyrl_train.training_batch`` (current: ``__reduce__`` to a
rebuild function with numpy-bytes state; older ``skyrl_train.training_batch``: a plain pickled
dict subclass of tensors with ``metadata``). The stand-in modules are removed from ``sys.modules``
before importing, so the importer must read them as a user without SkyRL would.
"""

import json
import pickle
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from gfcr.formats import ImportFormatError, import_rollouts
from gfcr.store import samples as S
from gfcr.testing import tiny_tokenizer

# ------------------------------------------------------------------------------------------------
# ROLL
# ------------------------------------------------------------------------------------------------


def test_roll_columnar_dump_groups_answers_and_sampling(store, tmp_path):
    d = S.write_roll(tmp_path / "roll", steps=2, k=4)
    res = import_rollouts(store, "roll", [str(d)], run_id="r")
    assert len(res.rollouts) == 24 and len(res.files) == 2 and "without tokens" in res.notes[0]
    rs = store.rollouts(run="r", steps=(2, 2))
    assert len(rs) == 12 and all(x.tokens_source == "none" and len(x.token_ids) == 0 for x in rs)
    # reward = score of that response, in order; the text is kept
    line = json.loads((d / "rollout_dump_data.step_2.jsonl").read_text())
    by_text = {(x.messages[0].content, x.messages[-1].content): x.reward for x in rs}
    for p, out, sc in zip(line["prompt"], line["responses"], line["scores"], strict=True):
        assert by_text[(p, out)] == sc
    assert [m.role for m in rs[0].messages] == ["user", "assistant"]
    assert rs[0].sampling == {"generation_config": {"temperature": 0.99}} and rs[0].finish_reason is None
    # one group per (prompt, step), sample indices 0..k-1
    g = store.sql("SELECT group_id, list_sort(list(sample_index)) s FROM rollouts GROUP BY group_id").to_pylist()
    assert len(g) == 6 and all(x["s"] == [0, 1, 2, 3] for x in g)
    ps = {p.messages[0].content: p for p in store.prompts(task="roll")}
    assert len(ps) == 3 and ps["What is 6 * 7?"].answer == "42"
    assert ps["What is 6 * 7?"].category == "arith" and ps["What is 6 * 7?"].difficulty == 2.0
    assert ps["What is 6 * 7?"].meta["domain"] == "math_rule"


def test_roll_retokenized_with_tokenizer(store, tmp_path):
    d = S.write_roll(tmp_path / "roll", steps=1, k=2)
    tok = tiny_tokenizer()
    res = import_rollouts(store, "roll", [str(d)], tokenizer=tok)
    r = res.rollouts[0]
    assert r.tokens_source == "retokenized" and not res.notes
    assert tok.decode(r.token_ids[r.token_role == 1].tolist()) == r.messages[-1].content
    assert tok.decode(r.token_ids[r.token_role == 0].tolist()) == r.messages[0].content


def test_roll_row_per_response_and_step_from_file_name(store, tmp_path):
    d = tmp_path / "rows"
    d.mkdir()
    rows = [{"prompt": "q1", "responses": "a", "scores": 1.0, "ground_truth": {"x": 1}},
            {"prompt": "q1", "responses": "b", "scores": 0.0, "ground_truth": {"x": 1}}]
    (d / "rollout_dump_data.step_7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = import_rollouts(store, "roll", [str(d)])
    assert [(r.step, r.sample_index, r.reward) for r in res.rollouts] == [(7, 0, 1.0), (7, 1, 0.0)]
    assert res.rollouts[0].group_id == res.rollouts[1].group_id
    assert json.loads(store.prompts()[0].answer) == {"x": 1}


@pytest.mark.parametrize(
    "line, field",
    [
        ({"prompt": ["q", "q"], "responses": ["a", "b"], "scores": [1.0]}, "scores"),
        ({"prompt": ["q"], "responses": ["a"], "scores": ["high"]}, "scores"),
        ({"prompt": ["q"], "responses": [3], "scores": [1.0]}, "responses"),
        ({"responses": ["a"], "scores": [1.0]}, "prompt"),
        ({"messages": ["not json"], "responses": ["a"], "scores": [1.0]}, "messages"),
        ({"prompt": ["q"], "responses": ["a"], "scores": [1.0], "global_step": [-1]}, "global_step"),
        ({"prompt": ["q"], "scores": [1.0]}, "responses"),
    ],
)
def test_roll_malformed_names_file_line_field_and_writes_nothing(store, tmp_path, line, field):
    import_rollouts(store, "roll", [str(S.write_roll(tmp_path / "good", steps=1))])
    before = store.count(), store.count("prompts")
    d = tmp_path / "bad"
    d.mkdir()
    S.write_roll(d, steps=1)  # a good file in the same folder must not be written either
    bad = d / "rollout_dump_data.step_9.jsonl"
    bad.write_text(json.dumps(line) + "\n")
    with pytest.raises(ImportFormatError) as e:
        import_rollouts(store, "roll", [str(d)], run_id="again")
    assert str(bad) in str(e.value) and "line 1" in str(e.value) and f"field '{field}'" in str(e.value)
    assert (store.count(), store.count("prompts")) == before


def test_roll_truncated_line(store, tmp_path):
    bad = tmp_path / "rollout_dump_data.step_1.jsonl"
    bad.write_text('{"prompt": ["q"], "responses": ["a"], "sco\n')
    with pytest.raises(ImportFormatError, match="not valid JSON"):
        import_rollouts(store, "roll", [str(bad)])
    assert store.count() == 0


# ------------------------------------------------------------------------------------------------
# SkyRL stand-ins and a hand-built batch
# ------------------------------------------------------------------------------------------------

NEW_MOD = "skyrl.backends.skyrl_train.training_batch"
OLD_MOD = "skyrl_train.training_batch"

# (prompt ids, response ids, loss mask, reward on the last token, advantage)
ROWS = [
    ([11, 12, 13], [101, 102, 103], [1, 1, 1], 1.0, 0.5),
    ([11, 12, 13], [104, 105], [1, 1], 0.0, -0.5),
    ([21, 22], [201, 202, 203, 204], [1, 0, 0, 1], 1.0, 1.0),  # 202, 203: tool output, not trained
    ([21, 22], [205], [1], 0.0, -1.0),
]


def _lp(t: int) -> float:
    return -0.25 * (t + 1) - 1e-3 * t  # not exactly representable: checks the float32 bits survive


def _tensors(rows=ROWS, pad_size=0):
    """SkyRL's layout (preprocess.convert_prompts_responses_to_batch_tensors): each row left-padded
    to max(p+r); response tensors right-aligned in max(r). ``pad_size`` rows copy row 0 with
    loss_mask 0 (pad_training_input_batch)."""
    width = max(len(p) + len(r) for p, r, *_ in rows)
    rw = max(len(r) for _, r, *_ in rows)
    n = len(rows) + pad_size
    seq = torch.zeros(n, width, dtype=torch.int64)
    am = torch.zeros(n, width, dtype=torch.int64)
    rm = torch.zeros(n, rw, dtype=torch.int64)
    lm = torch.zeros(n, rw, dtype=torch.float32)
    lp = torch.zeros(n, rw, dtype=torch.float32)
    adv = torch.zeros(n, rw, dtype=torch.float32)
    rew = torch.zeros(n, rw, dtype=torch.float32)
    for i, (p, r, m, reward, a) in enumerate(rows):
        seq[i, width - len(p) - len(r):] = torch.tensor(p + r)
        am[i, width - len(p) - len(r):] = 1
        rm[i, rw - len(r):] = 1
        lm[i, rw - len(r):] = torch.tensor(m, dtype=torch.float32)
        lp[i, rw - len(r):] = torch.tensor([_lp(t) for t in range(len(r))])
        adv[i, rw - len(r):] = torch.tensor([a if mk else 99.0 for mk in m])  # 99: never in the mean
        rew[i, -1] = reward
    for j in range(pad_size):
        i = len(rows) + j
        seq[i], am[i], rm[i], lp[i], adv[i], rew[i] = seq[0], am[0], rm[0], lp[0], adv[0], rew[0]
    return {"sequences": seq, "attention_mask": am, "response_mask": rm, "loss_mask": lm,
            "rollout_logprobs": lp, "action_log_probs": lp - 0.5, "advantages": adv, "rewards": rew,
            "base_action_log_probs": (lp - 0.125).to(torch.bfloat16), "values": None}


def _expected(i: int):
    p, r, m, reward, a = ROWS[i]
    ids = np.asarray(p + r, np.int32)
    role = np.asarray([0] * len(p) + m, np.int8)
    lps = np.asarray([0.0] * len(p) + [_lp(t) if mk else 0.0 for t, mk in enumerate(m)], np.float32)
    return ids, role, lps, reward, a, p


def _ser(t: torch.Tensor) -> dict:
    try:
        a = t.numpy()
        return {"format": "numpy", "data": a.tobytes(), "shape": a.shape, "dtype": str(a.dtype)}
    except TypeError:  # bfloat16
        import io

        buf = io.BytesIO()
        torch.save(t, buf)
        return {"format": "torch", "data": buf.getvalue()}


def _fake_module(name: str, old: bool):
    """A stand-in for SkyRL's training_batch module (its classes pickle by module path)."""
    mod = types.ModuleType(name)

    def _rebuild_tensor_batch(cls, state):  # pragma: no cover - only pickled, never called here
        raise AssertionError("the importer must not need SkyRL's own rebuild function")

    class TensorBatch(dict):
        metadata = None

        def __reduce__(self):  # the current layout: tensors as numpy bytes in a state dict
            state = {"batch_dict": {k: None if v is None else _ser(v) for k, v in self.items()},
                     "batch_size": len(self["attention_mask"]), "device": torch.device("cpu"), "metadata": self.metadata}
            return (mod._rebuild_tensor_batch, (type(self), state))

    class TrainingInputBatch(TensorBatch):
        pass

    class OldTrainingInputBatch(dict):  # the older layout: a plain pickled dict subclass
        metadata = None

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self._batch_size = len(self["sequences"]) if "sequences" in self else None
            self._device = None

    members = {"_rebuild_tensor_batch": _rebuild_tensor_batch, "TensorBatch": TensorBatch,
               "TrainingInputBatch": OldTrainingInputBatch if old else TrainingInputBatch}
    for nm, obj in members.items():
        obj.__module__, obj.__qualname__ = name, nm
        setattr(mod, nm, obj)
    return mod


def write_skyrl(path, tensors, metadata, old=False):
    name = OLD_MOD if old else NEW_MOD
    mod = _fake_module(name, old)
    parts = name.split(".")
    saved = {k: sys.modules.get(k) for k in (".".join(parts[:i]) for i in range(1, len(parts) + 1))}
    for k in saved:
        sys.modules[k] = mod if k == name else types.ModuleType(k)
    try:
        b = mod.TrainingInputBatch(tensors)
        b.metadata = metadata
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(b, fh)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return path


# ------------------------------------------------------------------------------------------------
# SkyRL tests
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grouping", ["boundaries", "prompt-tokens"])
def test_skyrl_current_layout_maps_every_field_bit_for_bit(store, tmp_path, grouping):
    t = _tensors(pad_size=2)
    del t["rewards"]  # SkyRL's trainer pops rewards (and uids) before dumping
    meta = {"pad_size": 2, "response_length": 4}
    if grouping == "boundaries":
        meta["policy_prompt_boundaries"] = [(0, 2), (2, 4)]
    p = write_skyrl(tmp_path / "exp" / "dumped_data" / "global_step_12_training_input.pkl", t, meta)
    assert "skyrl" not in sys.modules  # the importer works without SkyRL
    res = import_rollouts(store, "skyrl", [str(tmp_path / "exp" / "dumped_data")], run_id="s", trust_pickle=True)
    assert res.files == [str(p)] and len(res.rollouts) == 4  # the 2 padding rows are skipped
    assert any("no 'rewards'" in n for n in res.notes)
    got = sorted(store.rollouts(run="s"), key=lambda r: r.meta["row"])
    for i, r in enumerate(got):
        ids, role, lps, _, adv, prompt = _expected(i)
        assert r.token_ids.tobytes() == ids.tobytes() and r.token_ids.dtype == np.int32
        assert r.token_role.tobytes() == role.tobytes()
        assert r.logprobs.tobytes() == lps.tobytes()
        assert r.signals == {"advantage": adv}
        assert r.reward is None and r.meta["reward_in_dump"] is False  # unknown, never 0.0
        assert (r.step, r.policy_version, r.tokens_source, r.finish_reason) == (12, "step-12", "engine", None)
        assert store.prompts(ids=[r.prompt_id])[0].meta["prompt_token_ids"] == prompt
    assert [r.sample_index for r in got] == [0, 1, 0, 1]
    assert got[0].group_id == got[1].group_id != got[2].group_id == got[3].group_id
    assert store.count(where="reward IS NULL") == 4  # SQL sees unknown, not a score of 0


def test_skyrl_older_dict_pickle_with_rewards_and_uids(store, tmp_path):
    t = _tensors()
    del t["rollout_logprobs"]  # older dumps: only the trainer's action_log_probs
    del t["base_action_log_probs"]
    # rows 0 and 2 share a uid although their prompts differ: uids win over prompt tokens
    meta = {"uids": ["u0", "u1", "u0", "u1"]}
    write_skyrl(tmp_path / "global_step_3_training_input.pkl", t, meta, old=True)
    res = import_rollouts(store, "skyrl", [str(tmp_path / "global_step_3_training_input.pkl")], trust_pickle=True)
    assert any("action_log_probs" in n for n in res.notes)
    got = sorted(res.rollouts, key=lambda r: r.meta["row"])
    for i, r in enumerate(got):
        ids, role, lps, reward, _, _ = _expected(i)
        assert r.token_ids.tobytes() == ids.tobytes() and r.token_role.tobytes() == role.tobytes()
        want = np.where(role == 1, lps - np.float32(0.5), np.float32(0)).astype(np.float32)
        assert r.logprobs.tobytes() == want.tobytes()
        assert r.reward == reward and r.meta["reward_in_dump"] is True  # sum of per-token rewards
    assert got[0].meta["logprobs_from"] == "action_log_probs"
    assert [r.sample_index for r in got] == [0, 0, 1, 1]
    assert got[0].group_id.endswith("#u0") and got[2].group_id.endswith("#u0")


def test_skyrl_decodes_messages_with_a_tokenizer(store, tmp_path):
    tok = tiny_tokenizer()
    p = tok("What is 2+2?", add_special_tokens=False)["input_ids"]
    r = tok(" 4", add_special_tokens=False)["input_ids"]
    t = _tensors(rows=[(p, r, [1] * len(r), 1.0, 0.0)])
    write_skyrl(tmp_path / "global_step_1_training_input.pkl", t, {})
    res = import_rollouts(store, "skyrl", [str(tmp_path)], tokenizer=tok, trust_pickle=True)
    assert [m.content for m in res.rollouts[0].messages] == ["What is 2+2?", " 4"]


def test_skyrl_refused_without_trust_pickle(store, tmp_path):
    p = write_skyrl(tmp_path / "global_step_1_training_input.pkl", _tensors(), {})
    with pytest.raises(ImportFormatError, match="--trust-pickle") as e:
        import_rollouts(store, "skyrl", [str(p)])
    assert "TrainingInputBatch" in str(e.value) and str(p) in str(e.value)
    assert store.count() == 0


def _bad_missing_seq(t):
    del t["sequences"]


def _bad_loss_mask(t):
    t["loss_mask"] = t["loss_mask"][:, :2]


def _bad_logprob(t):
    t["rollout_logprobs"][0, -1] = 0.5


def _bad_attention(t):
    t["attention_mask"] = t["attention_mask"][:, 1:]


@pytest.mark.parametrize(
    "mutate, field, where",
    [(_bad_missing_seq, "sequences", "batch"), (_bad_loss_mask, "loss_mask", "batch"),
     (_bad_logprob, "rollout_logprobs", "row 0"), (_bad_attention, "attention_mask", "batch")],
)
def test_skyrl_malformed_names_file_and_field_and_writes_nothing(store, tmp_path, mutate, field, where):
    d = tmp_path / "dumped_data"
    write_skyrl(d / "global_step_1_training_input.pkl", _tensors(), {})
    import_rollouts(store, "skyrl", [str(d)], run_id="ok", trust_pickle=True)
    before = store.count(), store.count("prompts")
    t = _tensors()
    mutate(t)
    bad = write_skyrl(d / "global_step_2_training_input.pkl", t, {})
    with pytest.raises(ImportFormatError) as e:
        import_rollouts(store, "skyrl", [str(d)], run_id="again", trust_pickle=True)
    assert str(bad) in str(e.value) and f"{where}: field '{field}" in str(e.value)
    assert (store.count(), store.count("prompts")) == before


def test_skyrl_truncated_or_foreign_pickle(store, tmp_path):
    good = write_skyrl(tmp_path / "a" / "global_step_1_training_input.pkl", _tensors(), {})
    trunc = tmp_path / "b" / "global_step_1_training_input.pkl"
    trunc.parent.mkdir()
    trunc.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ImportFormatError, match="cannot be unpickled"):
        import_rollouts(store, "skyrl", [str(trunc)], trust_pickle=True)
    other = tmp_path / "c" / "global_step_1_training_input.pkl"
    other.parent.mkdir()
    other.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ImportFormatError, match="expected a SkyRL TrainingInputBatch"):
        import_rollouts(store, "skyrl", [str(other)], trust_pickle=True)
    noname = tmp_path / "d" / "batch.pkl"
    noname.parent.mkdir()
    noname.write_bytes(good.read_bytes())
    with pytest.raises(ImportFormatError, match="field 'global_step'"):
        import_rollouts(store, "skyrl", [str(noname)], trust_pickle=True)
    assert store.count() == 0


def test_cli_imports_roll_and_skyrl(tmp_path):
    def gfcr(*args):
        return subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True,
                              timeout=120)

    st = tmp_path / "st"
    p = gfcr("store", "import", st, S.write_roll(tmp_path / "roll", steps=1), "--from", "roll")
    assert p.returncode == 0 and "imported 12 new rollouts" in p.stdout, p.stderr
    pk = write_skyrl(tmp_path / "sk" / "global_step_4_training_input.pkl", _tensors(), {})
    p = gfcr("store", "import", st, pk, "--from", "skyrl")
    assert p.returncode == 2 and "--trust-pickle" in p.stderr
    p = gfcr("store", "import", st, pk, "--from", "skyrl", "--trust-pickle")
    assert p.returncode == 0 and "imported 4 new rollouts" in p.stdout and "engine" in p.stdout, p.stderr
