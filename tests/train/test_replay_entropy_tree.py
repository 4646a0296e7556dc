"""The loop on a tiny model with rewards that vary: replay provenance read by Diagnose, per-rollout
entropy, the tree topology with TreeRL per-token advantages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gfcr.filters import verifiers
from gfcr.filters.verifiers import Verdict
from gfcr.store import RolloutStore
from gfcr.train.config import load_config
from gfcr.train.loop import train, with_replay_events


class LastTokenParity:
    """Passes when the last sampled token id is even: a random tiny model then gets mixed groups."""

    name = "last_token_parity"
    version = "test"

    def verify(self, completion, answer=None, tests=None, **context):
        r = context["rollout"]
        ok = int(r.token_ids[-1]) % 2 == 0
        return Verdict(passed=ok, score=float(ok), evidence={"last": int(r.token_ids[-1])})


@pytest.fixture
def parity(monkeypatch):
    monkeypatch.setitem(verifiers.VERIFIERS, LastTokenParity.name, LastTokenParity)


def _cfg(tiny_dir, tmp_path, steps, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": steps, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 4, "generate.prompts_per_step": 2, "generate.max_tokens": 4,
        "verify.verifier": LastTokenParity.name, "optim.lr": 1e-3,
    }
    base.update(over)
    return load_config(None, base)


def _rows(res):
    return [json.loads(x) for x in res.metrics_path.read_text().splitlines()]


def test_with_replay_events_by_hand():
    m = with_replay_events({"trained": True, "replayed_at_step": [3]}, 5, [0.9])
    assert m["replayed_at_step"] == [3, 5] and m["replay_importance_weight"] == [None, 0.9] and m["trained"]
    assert with_replay_events(m, 5, [0.9]) == m  # redoing a step does not count it twice
    m2 = with_replay_events(m, 4, [float("nan"), 1.1])  # two uses at one step; nan = not measured
    assert m2["replayed_at_step"] == [3, 4, 4, 5] and m2["replay_importance_weight"] == [None, None, 1.1, 0.9]
    assert with_replay_events({"replayed_at_step": 2}, 2, [1.0])["replayed_at_step"] == [2]  # int form accepted


def test_replay_is_recorded_in_the_store_and_read_by_diagnose(tiny_dir, tmp_path, parity):
    from gfcr.diagnose.metrics import step_metrics

    cfg = _cfg(tiny_dir, tmp_path, steps=3, replay={"buffer": "fifo", "per_step": 3})
    d = tmp_path / "run"
    train(cfg, run_dir=d, progress=False, stop_after=2)
    res = train(cfg, resume=d, progress=False)  # the buffer is rebuilt from the store on resume
    rows = _rows(res)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["n_replayed"] for r in rows] == [0, 3, 3]
    assert any(0 < (r["verified_rate"] or 0) < 1 for r in rows)  # rewards vary, so advantages are non-zero
    for r in rows[1:]:  # replayed rollouts are mixed into the update
        assert r["n_seqs"] == r["n_trained"] + 3
        assert r["replay_lag_mean"] >= 1
    store = RolloutStore.open(res.store_path)
    rs = store.rollouts()
    events = [(r.rollout_id, s, r.step) for r in rs for s in r.meta.get("replayed_at_step", [])]
    assert sorted(s for _, s, _ in events) == [1, 1, 1, 2, 2, 2]  # each event once, resume included
    assert all(s > step for _, s, step in events)
    assert all(r.meta["trained"] for r in rs if "replayed_at_step" in r.meta)
    for r in rs:
        ws = r.meta.get("replay_importance_weight", [])
        assert len(ws) == len(r.meta.get("replayed_at_step", []))
        assert all(w is None or 0 < w < 10 for w in ws)
    assert any(w is not None for r in rs for w in r.meta.get("replay_importance_weight", []))

    m = {row["step"]: row for row in step_metrics(store).to_pylist()}
    assert m[0]["n_replayed"] == 0 and m[0]["staleness_mean"] is None
    for s in (1, 2):
        assert m[s]["n_replayed"] == 3
        lags = [s - step for _, at, step in events if at == s]
        assert m[s]["staleness_mean"] == pytest.approx(np.mean(lags))
        ws = [w for r in rs for at, w in zip(r.meta.get("replayed_at_step", []), r.meta.get("replay_importance_weight", []),
                                              strict=True) if at == s and w is not None]
        if ws:  # Diagnose reads the weights the loop recorded
            assert m[s]["iw_mean"] == pytest.approx(np.mean(ws)) and m[s]["iw_max"] == pytest.approx(max(ws))
        else:
            assert m[s]["iw_mean"] is None

    # per-rollout entropy: written for every rollout, finite, within [0, log V]; Diagnose reads it
    ents = [r.signals.get("entropy") for r in rs]
    assert all(e is not None and np.isfinite(e) and 0 < e <= np.log(512) + 1e-6 for e in ents)
    assert all(row["entropy_mean"] is not None and np.isfinite(row["entropy_mean"]) for row in m.values())


def test_tree_topology_trains_on_treerl_advantages(tiny_dir, tmp_path, parity, monkeypatch):
    from gfcr.filters.treerl import tree_advantages_for
    from gfcr.train import trainer as trainer_mod

    seen = []
    orig = trainer_mod.PolicyTrainer.update

    def spy(self, rollouts, advantages, *rest):
        seen.append((list(rollouts), list(advantages)))
        return orig(self, rollouts, advantages, *rest)

    monkeypatch.setattr(trainer_mod.PolicyTrainer, "update", spy)
    tree = {"m": 2, "n": 1, "l": 1, "t": 1, "min_prefix_frac": 0.0}
    cfg = _cfg(tiny_dir, tmp_path, steps=2, **{"generate.topology": {"name": "tree", "params": tree},
                                               "generate.max_tokens": 6})
    res = train(cfg, run_dir=tmp_path / "tree", progress=False)
    rows = _rows(res)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["n_rollouts"] == 2 * 4 for r in rows)  # m * (1 + t*n*l) = 4 leaves per prompt
    rs = RolloutStore.open(res.store_path).rollouts()
    assert sum(r.parent_id is not None for r in rs) == 2 * 2 * 2  # 2 branches per prompt per step
    want = tree_advantages_for(rs)
    for r in rs:  # the stored scalar is the mean over the leaf's generated tokens
        gen = r.token_role == 1
        assert r.signals["advantage"] == pytest.approx(float(want[r.rollout_id][gen].mean()), abs=1e-6)
        assert np.isfinite(r.signals["entropy"])
    assert len(seen) == 2
    live = 0
    for batch, advs in seen:  # the update got TreeRL's per-token advantages, not group ones
        for r, a in zip(batch, advs, strict=True):
            assert isinstance(a, np.ndarray) and a.shape == (len(r.token_ids),)
            np.testing.assert_allclose(a, want[r.rollout_id], atol=1e-6)
            live += bool(np.any(a != 0))
    assert live > 0
    assert any(r.get("n_forward", 0) > 0 for r in rows)


def test_unsupported_topology_combinations_are_refused(tiny_dir, tmp_path, parity):
    from gfcr.train.config import ConfigError

    with pytest.raises(ConfigError, match="gfpo"):
        _cfg(tiny_dir, tmp_path, steps=1, **{"generate.topology": "tree", "control.group": "gfpo"})
    with pytest.raises(ConfigError, match="multi_turn needs generate.topology.params.env"):  # refused at config load
        _cfg(tiny_dir, tmp_path, steps=1, **{"generate.topology": "multi_turn"})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
