"""Kill and resume: a run interrupted (between append and checkpoint, and after a clean checkpoint)
and resumed equals an uninterrupted run of the same seed: same prompts, same samples, same weights,
same selector state, with a stateful selector, group policy and replay buffer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gfcr.filters import verifiers
from gfcr.filters.verifiers import Verdict
from gfcr.store import RolloutStore
from gfcr.train import loop as loop_mod
from gfcr.train.checkpoint import latest_checkpoint
from gfcr.train.config import load_config
from gfcr.train.loop import train


class LastTokenParity:
    """Passes when the last sampled token id is even: a random tiny model then gets mixed groups."""

    name = "last_token_parity"
    version = "test"

    def verify(self, completion, answer=None, tests=None, **context):
        ok = int(context["rollout"].token_ids[-1]) % 2 == 0
        return Verdict(passed=ok, score=float(ok), evidence={"value": int(context["rollout"].token_ids[-1]) % 3})


OPTIONS = {
    "greso+dynamic_sampling+repo": {
        "control": {"selector": "greso", "group": {"name": "dynamic_sampling", "params": {"max_num_gen_batches": 2}}},
        "replay": {"buffer": "repo", "params": {"num_replays": 2, "max_cache_size": 4, "min_cache_to_replay": 2}}},
    "vade+adaptive_k+exgrpo": {
        "control": {"selector": "vade", "group": {"name": "adaptive_k", "params": {"k_min": 2, "k_max": 6}}},
        "replay": {"buffer": "exgrpo", "params": {"start_solved_ratio": 0.2}}},
}


def _cfg(tiny_dir, tmp_path, extra):
    base = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 4, "tensorboard": False, "seed": 3,
            "tasks": [{"name": "arith", "n_train": 3, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 4, "generate.prompts_per_step": 2, "generate.max_tokens": 4, "optim.lr": 1e-3,
            "verify.verifier": LastTokenParity.name, "signals.entropy": False}
    return load_config(None, base | extra)


def _trace(run_dir):
    store = RolloutStore.open(run_dir / "store")
    rs = sorted(store.rollouts(), key=lambda r: (r.step, r.group_id, r.sample_index))
    key = {r.rollout_id: f"{r.step}/{r.group_id.replace(r.run_id, 'RUN')}/{r.sample_index}" for r in rs}
    samples = [(r.step, r.prompt_id, key[r.rollout_id], r.token_ids.tolist(), r.meta.get("trained"),
                r.meta.get("replayed_at_step")) for r in rs]
    from safetensors.torch import load_file

    w = load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))
    state = json.loads((latest_checkpoint(run_dir) / "loop_state.json").read_text())
    buffer = json.loads(json.dumps(state["buffer"]), object_hook=lambda d: d)
    text = json.dumps(buffer, sort_keys=True)
    for rid, k in key.items():  # rollout ids are random per run: compare the buffer by (step, group, sample)
        text = text.replace(rid, k)
    return samples, w, state["selector"], text


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_kill_between_append_and_checkpoint_then_resume_equals_uninterrupted(tiny_dir, tmp_path, monkeypatch, option):
    monkeypatch.setitem(verifiers.VERIFIERS, LastTokenParity.name, LastTokenParity)
    cfg = _cfg(tiny_dir, tmp_path, OPTIONS[option])
    train(cfg, run_dir=tmp_path / "full", progress=False)
    full = _trace(tmp_path / "full")

    cut = tmp_path / "cut"
    train(cfg, run_dir=cut, progress=False, stop_after=1)  # a clean stop after step 0's checkpoint
    real = loop_mod.save_checkpoint

    def killed(t, step):
        if step == 2:
            raise KeyboardInterrupt("killed between append and checkpoint")
        return real(t, step)

    monkeypatch.setattr(loop_mod, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, resume=cut, progress=False)  # steps 1 and 2 appended, step 2 never checkpointed
    assert latest_checkpoint(cut).name == "step_000001"
    assert RolloutStore.open(cut / "store").scan(steps=(2, 2), columns=["step"]).num_rows > 0
    monkeypatch.setattr(loop_mod, "save_checkpoint", real)
    res = train(cfg, resume=cut, progress=False)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    assert [m["step"] for m in rows] == [0, 1, 2, 3] and rows[2]["reused_rollouts"] > 0

    samples, w, selector, buffer = _trace(cut)
    assert samples == full[0]  # same prompts, same tokens, same trained flags and replay events, each step once
    assert selector == full[2] and buffer == full[3]  # GRESO/VADE state and the replay buffer: no step lost
    assert all(torch.equal(w[k], full[1][k]) for k in w)  # same weights, bit for bit
    assert len({s[2] for s in samples}) == len(samples)
    assert np.mean([bool(s[4]) for s in samples]) > 0  # something was trained


def _pool_trace(run_dir, key):
    """The checkpointed partial-rollout pool: per held rollout (key, tokens, logprobs, token versions)."""
    from gfcr.control.partial import load_pool

    groups = load_pool(latest_checkpoint(run_dir) / "partial_pool.arrow")
    return [[(key.get(r.rollout_id, r.group_id.replace(r.run_id, "RUN") + f"/{r.sample_index}"), r.step,
              r.policy_version, r.token_ids.tolist(), r.logprobs.tolist(), r.meta.get("token_versions"),
              r.meta.get("partial_steps")) for r in g] for g in groups]


def test_partial_rollouts_resume_exactly_with_the_held_pool(tiny_dir, tmp_path, monkeypatch):
    """generate.partial_budget 2 of max_tokens 6: every rollout spans 3 steps, so every checkpoint holds
    unfinished groups. A clean stop after step 1 (groups of steps 0 and 1 held) and a kill between step
    3's append and its checkpoint, then resume: the same tokens, behaviour log-probs, per-token versions
    and stored rows as an uninterrupted run, each rollout stored once, and the same pool at the end."""
    monkeypatch.setitem(verifiers.VERIFIERS, LastTokenParity.name, LastTokenParity)
    cfg = _cfg(tiny_dir, tmp_path, {"steps": 6, "generate.max_tokens": 6, "generate.partial_budget": 2})
    train(cfg, run_dir=tmp_path / "full", progress=False)
    full = _trace(tmp_path / "full")

    cut = tmp_path / "cut"
    train(cfg, run_dir=cut, progress=False, stop_after=2)  # clean stop: the pool holds steps 0 and 1's groups
    real = loop_mod.save_checkpoint

    def killed(t, step):
        if step == 3:
            raise KeyboardInterrupt("killed between append and checkpoint")
        return real(t, step)

    monkeypatch.setattr(loop_mod, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, resume=cut, progress=False)
    assert latest_checkpoint(cut).name == "step_000002"
    n3 = RolloutStore.open(cut / "store").scan(steps=(3, 3), columns=["step"]).num_rows
    assert n3 > 0, "groups held at the clean stop must complete at step 3 (a lost pool completes none)"
    monkeypatch.setattr(loop_mod, "save_checkpoint", real)
    res = train(cfg, resume=cut, progress=False)

    samples, w, selector, _ = _trace(cut)
    assert len(samples) > 0 and samples == full[0]  # same prompts, tokens, steps, trained flags; each once
    assert all(torch.equal(w[k], full[1][k]) for k in w)  # same weights, bit for bit
    assert selector == full[2]
    store_full = RolloutStore.open(tmp_path / "full" / "store").rollouts()
    store_cut = RolloutStore.open(cut / "store").rollouts()
    by = lambda rs: sorted((r.step, r.group_id.replace(r.run_id, "RUN"), r.sample_index, r.logprobs.tolist(),  # noqa: E731
                            r.meta.get("token_versions"), r.meta.get("started_step")) for r in rs)
    assert by(store_cut) == by(store_full)  # the behaviour log-probs and versions of every segment
    assert any(r.meta.get("started_step", r.step) < r.step for r in store_cut)  # rows that crossed the cut
    pool_cut, pool_full = _pool_trace(cut, {}), _pool_trace(tmp_path / "full", {})
    assert len(pool_full) > 0 and pool_cut == pool_full  # the held groups at the end: same tokens, versions
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    rows_full = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows] == list(range(6))
    assert [m["partial_held_tokens"] for m in rows] == [m["partial_held_tokens"] for m in rows_full]
