"""``gfcr simulate`` and ``gfcr train`` run one step sequence (gfcr.control.step): on a shared scripted
world (per-prompt success probabilities given, draws keyed on prompt/step/round/sample) they build
the same batch for every group policy and every replay buffer: the same prompts, the same K per
prompt, the same kept groups, the same replayed items with the same advantages and loss forms.

The loop is the real one (a tiny random model, its selector, group policy, buffer, estimator and
update); only generation and the verdict are scripted. ExGRPO's trajectory choice reads entropy
under the current policy in the loop and the stored one in the simulator (it has no model): the
loop's entropy is set to the simulator's (0 for every trajectory, ties broken by rollout id).
"""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.sim.simulator import SimConfig, StrategyConfig, _Run
from gfcr.testing import ScriptedWorld, make_rollout
from gfcr.train.config import load_config
from gfcr.train.loop import TrainingRun, prepare_run

K, B, STEPS, SEED = 4, 2, 6, 5
P = [0.1, 0.25, 0.5, 1.0]  # one prompt always solved

#: name → (group policy, its params, buffer, its params[, selector]): every Control group policy, every
#: Replay buffer, and every prompt selector (under the single-round policy)
CASES = {
    "single": ("single", {}, None, {}),
    "adaptive_k": ("adaptive_k", {"k_min": 2, "k_max": 6}, None, {}),
    "dynamic_sampling": ("dynamic_sampling", {"gen_prompts": 3, "max_num_gen_batches": 3}, None, {}),
    "greso_batch": ("dynamic_sampling", {"gen_prompts": 3, "max_num_gen_batches": 3, "adaptive_gen": True},
                    None, {}),
    "gfpo": ("gfpo", {"k": 2}, None, {}),
    "ar3po": ("ar3po", {"stages": 2, "per_stage": 2}, "ar3po", {}),
    "starpo_s": ("starpo_s", {"ratio": 0.5}, None, {}),
    "fifo": ("single", {}, "fifo", {"per_step": 2}),
    "repo": ("single", {}, "repo", {"num_replays": 2, "max_cache_size": 4, "min_cache_to_replay": 2,
                                    "strategy": "random"}),
    "exgrpo": ("single", {}, "exgrpo", {"start_solved_ratio": 0.2, "mix_ratio": 0.5}),
    **{f"selector_{name}": ("single", {}, None, {}, name) for name in ("greso", "vade", "vcrl", "sec")},
}


def _scripted_loop(t: TrainingRun, world: ScriptedWorld) -> list[tuple]:
    """Script the collector's engine and verifier from ``world``; record each step's collection and batch."""
    rec: list[tuple] = []

    def generate_groups(prompt_ids, sizes, step, rnd):
        groups = []
        for p in prompt_ids:
            ok, ln = world.draw(p, step, rnd, sizes[p])
            gid = f"{p}@{step}" + (f"#r{rnd}" if rnd else "")
            g = [make_rollout(i, run=t.run_id, step=step, prompt=p, n_ctx=2, n_gen=ln[i], seed=hash((gid, i)) % 10**6,
                              group_id=gid, rollout_id=f"{gid}-{i:03d}", signals={}, meta={"round": rnd},
                              policy_version=t.policy_version, verified=ok[i]) for i in range(sizes[p])]
            for r in g:
                r.token_ids = r.token_ids % 200  # inside the tiny vocabulary
            groups.append(g)
        return groups

    def verify(groups):
        for g in groups:
            for r in g:
                r.signals["correctness"], r.signals["format"] = float(r.verified), 0.0
            t.reward.apply(g)

    t.collector.generate_groups, t.collector.verify = generate_groups, verify
    t.update.rollout_entropy = lambda rs: np.zeros(len(rs))
    collect, batch = t.policy.collect, t._batch

    def spy_collect(*a, **kw):
        col = collect(*a, **kw)
        rec.append((col,))
        return col

    def spy_batch(kept, step):
        items = batch(kept, step)
        rec[-1] += (items,)
        return items

    t.policy.collect, t._batch = spy_collect, spy_batch
    return rec


def _view(col, items) -> dict:
    """What must agree: prompts and K per generated group, the kept groups, every batch row."""
    return {
        "generated": [(g[0].prompt_id, len(g)) for g in col.generated],
        "kept": [[(r.group_id, r.sample_index) for r in g] for g in col.kept],
        "items": [(it.rollout.rollout_id, it.rollout.step, it.group, it.replayed,
                   round(float(np.mean(it.advantage)), 6), it.weight, it.shaping) for it in items],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulator_and_loop_build_the_same_batch(tiny_dir, tmp_path, case):
    group, gparams, buffer, bparams, *sel = CASES[case]
    selector = sel[0] if sel else "uniform"
    over = {"model": tiny_dir, "output_dir": str(tmp_path), "seed": SEED, "tensorboard": False, "steps": STEPS,
            "tasks": [{"name": "arith", "n_train": len(P), "n_eval": 0, "params": {"level": 1}}],
            "generate.topology": {"name": "group", "params": {"k": K}}, "generate.prompts_per_step": B,
            "generate.max_tokens": 8, "signals.entropy": False,
            "control.group": {"name": group, "params": gparams}, "control.selector": selector}
    if buffer:
        over |= {"replay.buffer": {"name": buffer, "params": bparams}}
    cfg = load_config(None, over)
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    world = ScriptedWorld([p.prompt_id for p in t.train_prompts], P, seed=SEED)
    rec = _scripted_loop(t, world)
    t.run()
    t.close()

    strat = StrategyConfig(name=case, selector=selector, group={"name": group, "params": gparams},
                           buffer={"name": buffer, "params": bparams} if buffer else None)
    sim = _Run(SimConfig(n_prompts=10, train_prompts=B, group_size=K, seed=SEED, strategies=[strat]), strat, world=world)
    views = []
    for _ in range(STEPS):
        col, items, _ = sim.step_once()
        views.append(_view(col, items))
        sim.sel.end_step()
        sim.step += 1

    assert [_view(*r) for r in rec] == views
    items = [i for v in views for i in v["items"]]
    exercised = {  # each case's method changes the batch in this world (else the comparison proves little)
        "adaptive_k": any(len({k for _, k in v["generated"]}) > 1 for v in views),
        "dynamic_sampling": any(len(v["generated"]) > len(v["kept"]) for v in views),
        "greso_batch": any(len(v["generated"]) > len(v["kept"]) for v in views),
        "gfpo": all(len(g) == 2 for v in views for g in v["kept"]),
        "ar3po": any(k > 2 for v in views for _, k in v["generated"]) and any(i[3] for i in items),
        "starpo_s": all(len(v["kept"]) == 1 for v in views),
    }.get(case, buffer is None or any(i[3] for i in items))
    assert items and exercised, f"{case}: the scripted world does not exercise the method"
