"""A real TRL GRPOTrainer run on CPU with the gfcr recorder, gfcr reward functions and the gfcr
sampler: the store must hold every rollout TRL trained on, token for token, with TRL's rewards."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("trl")
import torch  # noqa: E402
from trl_helpers import arith_dataset, make_trainer  # noqa: E402

from gfcr.integrations.trl import GfcrSampler, TRLRecorder, completion_text, prompt_id_of, reward_function  # noqa: E402
from gfcr.store import RolloutStore  # noqa: E402


def odd_length(prompts, completions, **kw):
    """A plain TRL reward function (declines every 4th row: TRL turns None into NaN)."""
    return [None if i % 4 == 0 else float(len(completion_text(c)) % 3) for i, c in enumerate(completions)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl")
    store = RolloutStore.open(tmp / "store", create=True)
    rewards = [reward_function("math"), reward_function("format", pattern=r"\d"), odd_length]
    # steps_per_generation=2 > gradient_accumulation_steps=1: TRL computes old_per_token_logps
    trainer = make_trainer(str(tmp / "out"), rewards, max_steps=4, per_device=4, num_generations=2,
                           steps_per_generation=2, reward_weights=[1.0, 0.5, 2.0], log_completions=True)
    sampler = GfcrSampler.install(trainer, store, "greso")
    recorder = TRLRecorder(store, "grpo-test", sampler=sampler).attach(trainer)
    trained = []
    compute_loss = trainer.compute_loss

    def spy(model, inputs, *a, **kw):  # TRL's own tensors, as compute_loss receives them
        trained.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = spy
    trainer.train()
    return {"store": store, "trainer": trainer, "trained": trained, "sampler": sampler, "recorder": recorder,
            "out": tmp / "out"}


def _trained_rows(trained):
    rows = []
    for b in trained:
        for i in range(b["prompt_ids"].shape[0]):
            p = b["prompt_ids"][i][b["prompt_mask"][i] == 1]
            c = b["completion_ids"][i][b["completion_mask"][i] == 1]
            lp = b["old_per_token_logps"][i][b["completion_mask"][i] == 1]
            rows.append((tuple(torch.cat([p, c]).tolist()), round(float(b["advantages"][i]), 5),
                         tuple(np.round(lp.numpy(), 5).tolist())))
    return rows


def test_store_holds_every_trained_rollout_token_for_token(run):
    t = run["store"].scan(run="grpo-test")
    assert t.num_rows == 16  # 2 generation batches x 4 prompts x 2 generations
    assert sorted(set(t.column("step").to_pylist())) == [0, 2]  # generated at optimizer steps 0 and 2
    stored = []
    for ids, role, lp, sig in zip(t.column("token_ids").to_pylist(), t.column("token_role").to_pylist(),
                                  t.column("logprobs").to_pylist(), t.column("signals").to_pylist(), strict=True):
        role, lp = np.array(role), np.array(lp, np.float32)
        stored.append((tuple(ids), round(dict(sig)["advantage"], 5), tuple(np.round(lp[role == 1], 5).tolist())))
    trained = _trained_rows(run["trained"])
    # every optimizer step saw half a generation batch; together they are exactly the stored rows
    assert Counter(trained) == Counter(stored)
    metas = [json.loads(m) for m in t.column("meta").to_pylist()]
    assert {m["logprobs_from"] for m in metas} == {"old"}
    assert all(r == "trl-transformers" for r in (json.loads(s)["engine"] for s in t.column("sampling").to_pylist()))


def test_rewards_equal_trls_logged_rewards(run):
    t = run["store"].scan(run="grpo-test")
    df = t.to_pandas()
    df["row"] = [json.loads(m)["row"] for m in df["meta"]]
    names = run["trainer"].reward_func_names
    assert names == ["gfcr_math", "gfcr_format", "odd_length"]
    w = np.array([1.0, 0.5, 2.0])
    for step in (0, 2):
        ours = df[df.step == step].sort_values("row")
        # TRL's own completions table, written at the end of optimizer step step+1
        theirs = pd.read_parquet(run["out"] / "completions" / f"completions_{step + 1:05d}.parquet")
        assert len(theirs) == len(ours) == 8
        for name in names:
            mine = [dict(s).get(f"reward/{name}", np.nan) for s in ours["signals"]]
            np.testing.assert_allclose(mine, theirs[name].to_numpy(np.float64), rtol=0, atol=1e-6, equal_nan=True)
        np.testing.assert_allclose([dict(s)["advantage"] for s in ours["signals"]], theirs["advantage"], atol=1e-6)
        weighted = np.nansum(theirs[names].to_numpy(np.float64) * w, axis=1)
        np.testing.assert_allclose(ours["reward"].to_numpy(), weighted, atol=1e-6)
        logged = [h for h in run["trainer"].state.log_history if h.get("step") == step + 1 and "reward" in h]
        assert logged and abs(logged[0]["reward"] - ours["reward"].mean()) < 1e-5
        texts = [completion_text(c) for c in theirs["completion"]]
        assert [m[-1]["content"] for m in ours["messages"]] == texts


def test_verdicts_and_evidence_recorded(run):
    t = run["store"].scan(run="grpo-test")
    for v, verified, msgs in zip(t.column("verifier").to_pylist(), t.column("verified").to_pylist(),
                                 t.column("messages").to_pylist(), strict=True):
        v = json.loads(v)
        assert v["name"] == "math" and v["passed"] is verified
        assert set(v["parts"]) == {"gfcr_math", "gfcr_format"}
        assert v["evidence"]["gold"] in {str(i + 1 + 2 * i + 3) for i in range(8)}
        fmt = v["parts"]["gfcr_format"]
        assert fmt["passed"] == any(ch.isdigit() for ch in msgs[-1]["content"])


def test_sampler_chose_the_trained_prompts_and_its_state_is_in_the_store(run):
    store, sampler = run["store"], run["sampler"]
    t = store.scan(run="grpo-test").to_pandas()
    t["row"] = [json.loads(m)["row"] for m in t["meta"]]
    for k, step in enumerate((0, 2)):
        rows = t[t.step == step].sort_values("row")
        assert rows["prompt_id"].tolist()[::2] == sampler.selected[k]  # G=2 consecutive rows per prompt
    ctrl = store.get_control("greso")
    seen = Counter(t.groupby("group_id")["prompt_id"].first())
    assert {p: s["n_seen"] for p, s in ctrl.items()} == dict(seen)
    assert store.get_state("control.greso") is not None
    # a new sampler built over the same store resumes the selector's state
    again = GfcrSampler(arith_dataset(), "greso", num_generations=2, batch_size=4, store=store)
    assert again.selector.n_seen.tolist() == sampler.selector.n_seen.tolist()
    assert again.selector.step == sampler.selector.step
    prompts = {p.prompt_id: p for p in store.prompts()}
    assert len(prompts) == 8 and all(p.answer is not None for p in prompts.values())
    ds = arith_dataset()
    assert prompt_id_of(ds[0]["prompt"]) in prompts


def test_recorder_kept_off_the_training_thread(run):
    rec = run["recorder"]
    assert rec.writer.stats["steps"] == 2 and rec.writer.stats["rows"] == 16
    assert rec.writer._thread is not None and not rec.writer._thread.is_alive()  # closed at train end
    assert rec.capture_s < rec.writer.stats["write_s"]  # the training thread only copies and queues


def test_tool_turns_and_sampling_logprobs_from_a_rollout_func(tmp_path):
    """A multi-turn rollout (TRL's rollout_func with an env_mask over tool-output tokens, and the
    engine's own log-probs): the store keeps the tool tokens as context and the engine log-probs."""
    rng = np.random.default_rng(0)
    returned = []

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        tool = tok("<tool>calculator: 6 * 7</tool> <result>42</result>", add_special_tokens=False)["input_ids"]
        for p in prompts:
            text = tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            a = rng.integers(10, 300, 3).tolist()
            b = rng.integers(10, 300, int(rng.integers(1, 4))).tolist() + [tok.eos_token_id]
            comp = a + tool + b
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(comp)
            out["env_mask"].append([1] * len(a) + [0] * len(tool) + [1] * len(b))
            out["logprobs"].append((-rng.random(len(comp)) * 3).astype(np.float32).tolist())
        returned.append(out)
        return out

    store = RolloutStore.open(tmp_path / "store", create=True)
    trainer = make_trainer(str(tmp_path / "out"), [reward_function("format", pattern="42")], max_steps=2)
    trainer.rollout_func = rollout_func  # what GRPOTrainer(rollout_func=...) sets
    TRLRecorder(store, "tools").attach(trainer)
    seen = []
    compute_loss = trainer.compute_loss

    def spy(model, inputs, *a, **kw):
        seen.append((inputs["tool_mask"] * inputs["completion_mask"]).clone())
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = spy
    trainer.train()
    rows = store.rollouts(run="tools")
    assert len(rows) == 8 and len(seen) == 2
    flat = [(list(c), list(m), list(lp)) for o in returned
            for c, m, lp in zip(o["completion_ids"], o["env_mask"], o["logprobs"], strict=True)]
    for r in rows:
        match = [f for f in flat if r.token_ids[-len(f[0]):].tolist() == f[0]]
        assert match, "a stored rollout does not end with a completion the rollout_func returned"
        comp, mask, lp = match[0]
        k = len(comp)
        assert r.token_role[-k:].tolist() == mask and (r.token_role[:-k] == 0).all()
        want = np.where(np.array(mask) == 1, np.array(lp, np.float32), 0).astype(np.float32)
        np.testing.assert_array_equal(r.logprobs[-k:], want)
        assert r.meta["logprobs_from"] == "sampling" and r.finish_reason == "stop"
        assert r.cost.gen_tokens == sum(mask)
    # the loss mask TRL trained with covers exactly the stored model tokens, row for row
    trained = Counter(int(m.sum()) for t in seen for m in t)
    assert trained == Counter(int(r.token_role.sum()) for r in rows)
