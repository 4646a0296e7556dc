"""verl DataProto batches → store → back. The fixture was written by verl's own DataProto
(tests/contracts/make_verl_dataproto_fixture.py); the tests that need verl itself skip without it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gfcr.integrations.verl import (  # noqa: E402
    VerlRecorder,
    dataproto_to_rollouts,
    install_hook,
    rollouts_to_batch,
    to_dataproto,
)

FIX = Path(__file__).parents[1] / "contracts" / "fixtures"
EXACT = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
         "rollout_log_probs", "token_level_scores", "token_level_rewards", "advantages", "returns")


def fixture():
    doc = json.loads((FIX / "verl_dataproto.json").read_text())
    arrs = np.load(FIX / "verl_dataproto.npz")
    tensors = {k: torch.from_numpy(arrs[k]).to(getattr(torch, doc["dtypes"][k])) for k in arrs.files}
    nt = {}
    for k, vals in doc["non_tensor_batch"].items():
        a = np.empty(len(vals), dtype=object)
        a[:] = vals
        nt[k] = a
    return tensors, nt, doc


def stand_in():
    tensors, nt, doc = fixture()
    return SimpleNamespace(batch=tensors, non_tensor_batch=nt, meta_info=dict(doc["meta_info"])), doc


def _check_equal(tensors, nt, meta, rebuilt):
    got = rebuilt["tensors"]
    assert set(got) == set(tensors)
    for k in EXACT:
        assert np.array_equal(got[k], tensors[k].numpy()), k
        assert got[k].dtype == tensors[k].numpy().dtype, k
    real = tensors["attention_mask"][:, -tensors["responses"].shape[1]:].bool().numpy()
    # old_log_probs: verl leaves values at padded positions, which are not kept
    assert np.array_equal(got["old_log_probs"][real], tensors["old_log_probs"].numpy()[real])
    assert set(rebuilt["non_tensors"]) == set(nt)
    for k, v in nt.items():
        assert list(rebuilt["non_tensors"][k]) == list(v), k
    assert rebuilt["meta_info"] == meta


def test_fixture_round_trips_through_the_store(store):
    batch, doc = stand_in()
    rs, ps = dataproto_to_rollouts(batch, "verl-run", reward_extra_info=doc["reward_extra_info"])
    store.upsert_prompts(ps)
    store.append(rs)
    back = store.rollouts(run="verl-run")
    assert len(back) == 6
    _check_equal(batch.batch, batch.non_tensor_batch, doc["meta_info"], rollouts_to_batch(back))


def test_field_mapping():
    batch, doc = stand_in()
    rs, ps = dataproto_to_rollouts(batch, "r", reward_extra_info=doc["reward_extra_info"])
    t = {k: v.numpy() for k, v in batch.batch.items()}
    r0 = rs[0]
    P = t["prompts"].shape[1]
    real = t["attention_mask"][0] == 1
    assert r0.token_ids.tolist() == t["input_ids"][0][real].tolist()
    n_p = int(real[:P].sum())
    assert r0.token_role[:n_p].tolist() == [0] * n_p
    assert r0.token_role[n_p:].tolist() == t["response_mask"][0][real[P:]].tolist() == [1, 1, 0, 0, 1, 1, 1]
    lp = t["rollout_log_probs"][0][real[P:]]
    np.testing.assert_array_equal(r0.logprobs[n_p:], np.where(r0.token_role[n_p:] == 1, lp, 0))
    assert r0.meta["logprobs_from"] == "rollout_log_probs"
    for r, i in zip(rs, range(6), strict=True):
        assert r.step == 3 and r.policy_version == "step-3"
        assert r.reward == pytest.approx(float(t["token_level_rewards"][i].sum()))
        assert r.verified is doc["reward_extra_info"]["acc"][i]
        m = t["response_mask"][i] == 1
        assert r.signals["advantage"] == pytest.approx(float(t["advantages"][i][m].mean()))
        r.validate()
    assert [r.group_id for r in rs] == ["r/3/u0", "r/3/u0", "r/3/u1", "r/3/u1", "r/3/u2", "r/3/u2"]
    assert [r.sample_index for r in rs] == [0, 1, 0, 1, 0, 1]
    assert [r.prompt_id for r in rs[::2]] == ["verl-0", "verl-1", "verl-2"]
    assert {p.prompt_id: p.answer for p in ps} == {"verl-0": "10", "verl-1": "11", "verl-2": "12"}
    assert {p.task for p in ps} == {"openai/gsm8k", "lighteval/MATH"}


def test_acc_equal_to_score_is_a_verdict_not_a_truth_value():
    """verl's reward loop sets acc = score for a float scorer: a wrong answer scored -1 was stored
    verified=True (bool(-1)), so `--where verified` exports held wrong answers; and finish_reason
    was the invented string "unknown"."""
    batch, doc = stand_in()
    scores = [1.0, -1.0, 0.0, 1.0, -1.0, 0.5]
    rs, _ = dataproto_to_rollouts(batch, "r", reward_extra_info={"acc": scores, "score": scores})
    assert [r.verified for r in rs] == [True, False, False, True, False, True]
    assert all(r.finish_reason is None for r in rs)
    with pytest.raises(ValueError, match=r"row 0: reward_extra_info\['acc'\]"):
        dataproto_to_rollouts(batch, "r", reward_extra_info={"acc": ["yes"] * 6})


def test_bad_batch_is_refused_with_one_clear_line():
    batch, _ = stand_in()
    del batch.batch["response_mask"]
    with pytest.raises(ValueError, match="no 'response_mask' tensor"):
        dataproto_to_rollouts(batch, "r")
    batch, _ = stand_in()
    batch.meta_info.pop("global_steps")
    with pytest.raises(ValueError, match="no global step"):
        dataproto_to_rollouts(batch, "r")


def test_hook_records_each_batch_off_the_trainer_thread(store, tmp_path):
    calls = []

    class Trainer:  # the method verl's RayPPOTrainer calls after the actor update
        global_steps = 3
        config = SimpleNamespace(trainer={"gfcr": {"store": str(store.path), "run_id": "hooked"}})
        tokenizer = None

        def _log_rollout_data(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir):
            calls.append(rollout_data_dir)

    install_hook(Trainer)
    install_hook(Trainer)  # idempotent
    tr = Trainer()
    batch, doc = stand_in()
    tr._log_rollout_data(batch, doc["reward_extra_info"], {}, str(tmp_path))
    tr._gfcr_recorder.close()
    assert calls == [str(tmp_path)]  # verl's own dump still runs, once
    assert store.count(where="run_id = 'hooked'") == 6


# --- with verl's own class -------------------------------------------------------------------


def test_real_dataproto_round_trip(store):
    pytest.importorskip("verl", reason="verl is not installed (see docs/integrations.md)")
    from verl import DataProto

    tensors, nt, doc = fixture()
    dp = DataProto.from_dict(tensors=dict(tensors), non_tensors=dict(nt), meta_info=dict(doc["meta_info"]))
    rec = VerlRecorder(store, "verl-real")
    rec(dp, reward_extra_info=doc["reward_extra_info"])
    rec.close()
    back = to_dataproto(rollouts_to_batch(store.rollouts(run="verl-real")))
    assert isinstance(back, DataProto) and len(back) == len(dp)
    _check_equal({k: dp.batch[k] for k in dp.batch.keys()}, dp.non_tensor_batch, dp.meta_info,
                 {"tensors": {k: back.batch[k].numpy() for k in back.batch.keys()},
                  "non_tensors": back.non_tensor_batch, "meta_info": back.meta_info})


def test_hook_patches_verls_ray_ppo_trainer():
    pytest.importorskip("verl")
    try:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    except ImportError as e:
        pytest.skip(f"verl's trainer does not import here: {e}")
    import inspect

    params = list(inspect.signature(RayPPOTrainer._log_rollout_data).parameters)
    assert params == ["self", "batch", "reward_extra_infos_dict", "timing_raw", "rollout_data_dir"]
    install_hook()
    assert RayPPOTrainer._log_rollout_data._gfcr is True


def test_plugin_patches_the_trainer_when_verl_loads_it(tmp_path):
    pytest.importorskip("verl")
    import subprocess
    import sys

    code = ("import sys, verl\n"
            "assert 'verl.trainer.ppo.ray_trainer' not in sys.modules\n"  # nothing imported eagerly
            "from verl.trainer.ppo.ray_trainer import RayPPOTrainer\n"
            "print(getattr(RayPPOTrainer._log_rollout_data, '_gfcr', False))\n")
    env = dict(__import__("os").environ, VERL_USE_EXTERNAL_MODULES="gfcr.integrations.verl_plugin",
               PYTHONPATH=__import__("os").pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    last = (out.stderr.strip().splitlines() or [""])[-1]
    if out.returncode != 0 and last.startswith("ModuleNotFoundError"):
        pytest.skip(f"verl's trainer does not import here: {last}")
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-2000:]


def test_nan_log_prob_is_unknown_not_zero(store):
    """verl's NaN log-prob (no value for that token) is stored as unknown: the row's
    ``logprobs_from`` null, the position listed, null in the stored JSON, NaN again on the way back."""
    batch, doc = stand_in()
    t = batch.batch
    P = t["prompts"].shape[1]
    real = t["attention_mask"][0].bool().numpy()
    gen = np.flatnonzero(t["response_mask"][0].numpy().astype(bool) & real[P:])
    j = int(gen[1])  # a generated, real response position of row 0
    t["rollout_log_probs"][0, j] = float("nan")
    rs, ps = dataproto_to_rollouts(batch, "nan-run", reward_extra_info=doc["reward_extra_info"])
    pos = int(real[:P].sum()) + int(real[P:][:j].sum())  # that token's index in token_ids
    r0 = rs[0]
    assert r0.meta["logprobs_from"] is None and r0.meta["logprobs_unknown"] == [pos]
    assert rs[1].meta["logprobs_from"] == "rollout_log_probs" and "logprobs_unknown" not in rs[1].meta
    store.upsert_prompts(ps)
    store.append(rs)
    raw = json.loads(store.get([r0.rollout_id], columns=["meta"]).column("meta")[0].as_py())
    lp_real = raw["verl"]["per_token"]["rollout_log_probs"]
    assert lp_real[int(real[P:][:j].sum())] is None and None not in lp_real[:int(real[P:][:j].sum())]
    back = rollouts_to_batch(store.rollouts(run="nan-run"))["tensors"]["rollout_log_probs"]
    assert np.isnan(back[0, j]) and np.isfinite(np.delete(back[0], j)).all()
