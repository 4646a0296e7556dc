"""Data-parallel training (gfcr.train.dist) with 2 gloo processes on loopback, launched like torchrun
(RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gfcr.serve import free_port

UPDATE_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np, torch
    torch.set_num_threads(1)
    from gfcr.records import Rollout
    from gfcr.testing import tiny_model, tiny_tokenizer
    from gfcr.train import dist
    from gfcr.train.config import LossConfig, OptimConfig
    from gfcr.train.trainer import PolicyTrainer

    out, agg, mini = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_from_env("cpu")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=4)
    rng = np.random.default_rng(0)
    rs = []
    for i in range(6):
        ctx = tok("What is 1 + 2?")["input_ids"]
        ids = ctx + rng.integers(3, len(tok), size=4 + i).tolist()
        role = [0] * len(ctx) + [1] * (len(ids) - len(ctx))
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids])).logits[0]
            lp = [0.0] + torch.log_softmax(lg[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        rs.append(Rollout(run_id="r", prompt_id=f"p{i // 2}", token_ids=ids, token_role=role,
                          logprobs=[x if r else 0.0 for x, r in zip(lp, role)]))
    adv = [1.0, -1.0, 0.5, -0.5, 0.0, 2.0]
    tr = PolicyTrainer(model, LossConfig(agg=agg), OptimConfig(lr=1e-2, micro_batch=1, epochs=2,
                       mini_batch=None if mini == "none" else int(mini)), tok.pad_token_id)
    stats = tr.update(rs, adv)
    torch.save(model.state_dict(), f"{out}/rank{dist.rank()}.pt")
    with open(f"{out}/rank{dist.rank()}.json", "w") as fh:
        json.dump({"stats": stats, "iw": tr.last_importance_weight.tolist()}, fh)
''')


def _launch(tmp_path, script: str, args: list[str], world: int, timeout: int = 240) -> None:
    path = tmp_path / "worker.py"
    path.write_text(script)
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(path), *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, o in zip(procs, outs, strict=True):
        assert p.returncode == 0, o[-3000:]


@pytest.mark.parametrize("agg, mini", [("token-mean", "none"), ("seq-mean-token-mean", "4")])
def test_two_ranks_take_the_single_process_step(tmp_path, agg, mini):
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir()
    multi.mkdir()
    _launch(single, UPDATE_SCRIPT, [str(single), agg, mini], world=1)
    _launch(multi, UPDATE_SCRIPT, [str(multi), agg, mini], world=2)
    one = torch.load(single / "rank0.pt")
    r0, r1 = torch.load(multi / "rank0.pt"), torch.load(multi / "rank1.pt")
    for k in one:
        torch.testing.assert_close(r0[k], r1[k], atol=0, rtol=0)  # the ranks stay identical
        # and equal the one-process step up to float summation order (Adam divides by sqrt(v), so an
        # element whose gradient is ~0 can move ~1e-5 more or less; a step here moves elements ~1e-2)
        torch.testing.assert_close(r0[k], one[k], atol=1e-4, rtol=0)
    s1 = json.loads((single / "rank0.json").read_text())
    s2 = json.loads((multi / "rank0.json").read_text())
    assert s2["stats"]["world_size"] == 2.0 and s1["stats"]["world_size"] == 1.0
    for key in ("n_tokens", "n_forward", "n_optimizer_steps"):
        assert s2["stats"][key] == s1["stats"][key]
    for key in ("clip_frac", "ratio_mean", "entropy", "grad_norm"):
        assert s2["stats"][key] == pytest.approx(s1["stats"][key], abs=1e-5)
    assert s2["iw"][:4] == pytest.approx(s1["iw"][:4], abs=1e-6)


LOOP_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    torch.set_num_threads(1)
    from gfcr.models import model_hash
    from gfcr.train import dist
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, train

    model_dir, out, run_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = load_config(None, {
        "model": model_dir, "output_dir": out, "steps": 2, "tensorboard": False, "seed": 3,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 2, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 3, "generate.max_tokens": 4, "optim.lr": 0.05,
        "eval.k": 1, "eval.greedy": False, "eval.before": True, "eval.after": True,
    })
    seen = {}
    orig = TrainingRun.run
    def run(self, stop_after=None):
        seen["trainer"] = self
        return orig(self, stop_after)
    TrainingRun.run = run
    res = train(cfg, run_dir=run_dir, progress=False)
    with open(f"{out}/rank{dist.rank()}.json", "w") as fh:
        json.dump({"hash": model_hash(seen["trainer"].model), "steps": res.steps_done, "world": dist.world(),
                   "run_dir": str(res.run_dir), "eval_after": res.eval_after is not None}, fh)
''')


def test_two_rank_training_run_writes_once_and_keeps_ranks_identical(tmp_path):
    from gfcr.store import RolloutStore
    from gfcr.testing import save_tiny

    model = save_tiny(str(tmp_path / "m"))
    run_dir = tmp_path / "run"
    _launch(tmp_path, LOOP_SCRIPT, [model, str(tmp_path), str(run_dir)], world=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["steps"] == r1["steps"] == 2
    assert r0["run_dir"] == r1["run_dir"] == str(run_dir)  # one run folder, made by rank 0
    assert r0["hash"] == r1["hash"]  # the ranks end with the same weights
    assert r0["eval_after"] and not r1["eval_after"]  # rank 0 evaluates
    rs = RolloutStore.open(run_dir / "store").rollouts()
    assert len(rs) == 2 * 3 * 2 and len({r.rollout_id for r in rs}) == len(rs)  # each rollout written once
    for step in (0, 1):  # every selected prompt got its K samples, whichever rank sampled it
        per = [r for r in rs if r.step == step]
        assert sorted(r.sample_index for r in per) == [0, 0, 0, 1, 1, 1]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert all(m.get("world_size", 2.0) == 2.0 for m in metrics)
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "eval_after.json").exists()
