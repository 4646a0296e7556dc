"""The background step writer, the capture → rollout mapping, and the sampler's prompt skipping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gfcr.filters.verifiers import Verdict
from gfcr.integrations.trl import Capture, GfcrSampler, capture_to_rollouts
from gfcr.integrations.writer import StepBatch, StepWriter, WriterError
from gfcr.records import Prompt
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout


def test_writer_commits_one_version_per_step_off_the_calling_thread(store):
    w = StepWriter(store, max_pending=2)
    threads = []

    def job(step):
        def build():
            threads.append(threading.current_thread().name)
            return StepBatch(step, [make_rollout(i, step=step, prompt="p0") for i in range(3)],
                             prompts=[Prompt("p0", "arith", [{"role": "user", "content": "q"}])])
        return build

    v0 = store.version
    for s in range(4):
        w.submit(s, job(s))
    w.close()
    assert threads == ["gfcr-step-writer"] * 4
    assert store.version == v0 + 4  # one rollouts commit per step
    assert [r["rows"] for r in store.versions()[-4:]] == [3, 6, 9, 12]
    assert store.count("prompts") == 1


def test_writer_failure_surfaces_and_writes_nothing_after_it(store):
    w = StepWriter(store)
    w.submit(0, lambda: StepBatch(0, [make_rollout(0, step=0)]))
    bad = make_rollout(1, step=1)
    w.submit(1, lambda: StepBatch(1, [bad, bad]))  # duplicate rollout_id: the store refuses the batch
    w.submit(2, lambda: StepBatch(2, [make_rollout(2, step=2)]))
    with pytest.raises(WriterError, match="step 1"):
        w.flush()
    with pytest.raises(WriterError):
        w.submit(3, lambda: StepBatch(3, []))
    assert store.scan().column("step").to_pylist() == [0]


KILL_SCRIPT = textwrap.dedent("""
    import sys
    from trl_helpers import make_trainer
    from gfcr.integrations.trl import TRLRecorder, reward_function
    from gfcr.store import RolloutStore
    store = RolloutStore.open(sys.argv[1], create=True)
    tr = make_trainer(sys.argv[2], [reward_function("format", pattern=r"\\d")], max_steps=10000, per_device=4)
    TRLRecorder(store, "killed").attach(tr)
    print("training", flush=True)
    tr.train()
""")


def test_run_killed_mid_training_leaves_every_committed_step_intact(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT)
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), *sys.path]), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(tmp_path / "out")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 400
        n = 0
        while time.time() < deadline and proc.poll() is None:
            if (tmp_path / "store" / "gfcr-store.json").exists():
                n = RolloutStore.open(tmp_path / "store").count()
                if n >= 12:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, "the training process ended before it could be killed"
        assert n >= 12, "no steps were committed in time"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = RolloutStore.open(tmp_path / "store")
    t = store.scan(columns=["step", "token_ids", "reward"])
    steps = t.column("step").to_pylist()
    k = max(steps) + 1
    assert sorted(set(steps)) == list(range(k))  # a prefix of the run, no gap
    assert all(steps.count(s) == 4 for s in range(k))  # no step half-written
    assert all(len(ids) > 0 for ids in t.column("token_ids").to_pylist())
    store.append([make_rollout(0, run="after")])  # the store is still writable
    assert store.count() == 4 * k + 1


def _capture(**kw):
    B, P, C = 2, 4, 5
    base = dict(
        run_id="r", step=3, batch_index=1, rank=0, row_offset=0, num_generations=2,
        prompt_ids=np.array([[0, 0, 7, 8], [5, 6, 7, 8]]), prompt_mask=np.array([[0, 0, 1, 1], [1, 1, 1, 1]]),
        completion_ids=np.array([[11, 12, 13, 2, 0], [21, 22, 23, 24, 25]]), completion_lens=[4, 5],
        advantages=np.array([0.5, -0.5]), rewards=np.array([[1.0, np.nan], [np.nan, np.nan]]),
        weights=np.array([1.0, 2.0]), reward_names=["a", "b"],
        prompts=[[{"role": "user", "content": "q"}]] * B,
        completions=[[{"role": "assistant", "content": "x", "tool_calls": [{"name": "calc"}]},
                      {"role": "tool", "name": "calc", "content": "4"}, {"role": "assistant", "content": "4"}],
                     [{"role": "assistant", "content": "y"}]],
        prompt_ids_str=["p", "p"], eos_ids=[2, 0],
        tool_mask=np.array([[1, 0, 0, 1, 1], [1, 1, 1, 1, 1]]),
        logps=np.array([[-0.1, -0.2, -0.3, -0.4, 0.0], [-1, -2, np.nan, -4, -5]], np.float32), logps_from="sampling",
        verdicts={"a": [Verdict(True, 1.0, {"gold": "4"}), Verdict(None, 0.0, {"error": "no gold"})]},
        verifier_ids={"a": ("math", "1")}, outcome="a",
    )
    base.update(kw)
    assert P == 4 and C == 5
    return Capture(**base)


def test_capture_maps_padding_tool_turns_logprobs_and_unscorable_rows():
    r0, r1 = capture_to_rollouts(_capture())
    assert r0.token_ids.tolist() == [7, 8, 11, 12, 13, 2] and r0.token_role.tolist() == [0, 0, 1, 0, 0, 1]
    np.testing.assert_allclose(r0.logprobs, [0, 0, -0.1, 0, 0, -0.4], atol=1e-7)  # tool tokens: 0
    assert r0.finish_reason == "stop" and r1.finish_reason == "length"
    assert r0.reward == 1.0 and r0.signals == {"reward/a": 1.0, "advantage": 0.5} and r0.verified is True
    assert r0.meta["tool_calls"] == 1 and [m.role for m in r0.messages] == ["user", "assistant", "tool", "assistant"]
    assert r1.token_ids.tolist() == [5, 6, 7, 8, 21, 22, 23, 24, 25]
    assert r1.logprobs[6] == 0.0 and r1.meta["logprobs_missing"] == 1  # a NaN log-prob is not invented
    assert r1.reward == 0.0 and r1.meta["unscorable"] is True and "reward/a" not in r1.signals
    assert r1.verified is None and json.loads(json.dumps(r1.verifier))["parts"]["a"]["passed"] is None
    assert r0.group_id == r1.group_id and (r0.sample_index, r1.sample_index) == (0, 1)
    assert r0.cost.gen_tokens == 2 and r0.cost.prompt_tokens == 2
    for r in (r0, r1):
        r.validate()


def _drive(sampler, outcome, steps, rng):
    """Consume the sampler like TRL behind accelerate's dataloader (one batch fetched ahead) and feed
    back each group's outcomes; returns how often each prompt was chosen after the first 5 batches."""
    it = iter(sampler)
    per_batch = sampler.batch_size * sampler.G * sampler.repeat_count
    take = lambda: [next(it) for _ in range(per_batch)]  # noqa: E731
    nxt = take()
    counts = {}
    for step in range(steps):
        cur, nxt = nxt, take()
        idx = cur[: sampler.batch_size * sampler.G: sampler.G]
        groups = []
        for j in idx:
            pid = sampler.prompts[j].prompt_id
            groups.append((pid, outcome(pid, rng)))
            if step >= 5:
                counts[pid] = counts.get(pid, 0) + 1
        sampler.observe(groups, step)
    return counts


@pytest.mark.parametrize("name", ["greso", "vade", "vcrl", "sec", "uniform"])
def test_sampler_skips_zero_variance_prompts(name):
    from datasets import Dataset

    n = 40
    ds = Dataset.from_list([{"prompt": f"q{i}", "answer": "1", "category": ("easy", "mixed")[i % 2]} for i in range(n)])
    mixed = {f"q{i}" for i in range(n) if i % 2}

    def outcome(pid, rng):  # even prompts: always solved (zero variance); odd: a coin per sample
        text = next(p for p in s.prompts if p.prompt_id == pid).messages[0].content
        return rng.integers(0, 2, 4).astype(float).tolist() if text in mixed else [1.0] * 4

    s = GfcrSampler(ds, name, num_generations=4, batch_size=8, repeat_count=2, batches=60, seed=1)
    counts = _drive(s, outcome, 50, np.random.default_rng(0))
    on_mixed = sum(c for pid, c in counts.items()
                   if next(p for p in s.prompts if p.prompt_id == pid).messages[0].content in mixed)
    share = on_mixed / sum(counts.values())
    if name == "uniform":  # the control: no skipping
        assert 0.35 < share < 0.65
        return
    assert share > 0.7, f"{name}: only {share:.2f} of the picks went to prompts with reward variance (uniform: 0.5)"


def test_sampler_layout_matches_trls_repeat_sampler():
    from datasets import Dataset

    ds = Dataset.from_list([{"prompt": f"q{i}"} for i in range(6)])
    s = GfcrSampler(ds, "uniform", num_generations=2, batch_size=3, repeat_count=2, seed=0)
    out = list(s)
    assert len(out) == len(s) == 2 * 3 * 2 * 2
    first = out[:12]
    chunk = first[:6]
    assert first[6:] == chunk and chunk[0::2] == chunk[1::2] and len(set(chunk[0::2])) == 3
    with pytest.raises(ValueError, match="unknown prompt selector"):
        GfcrSampler(ds, "nope", num_generations=2, batch_size=3)


def test_reward_functions_called_the_way_trl_calls_them():
    from gfcr.integrations.trl import reward_function

    code = reward_function("code")
    good = [{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"}]
    bad = [{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a - b\n```"}]
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]
    out = code(prompts=[[{"role": "user", "content": "add"}]] * 3, completions=[good, bad, good],
               completion_ids=[[1], [2], [3]], tests=[tests, tests, None], trainer_state=None)
    assert out[0] == 1.0 and out[1] == pytest.approx(-0.3 + 1.3 * 0.5) and out[2] is None
    v = code.last_verdicts
    assert v[0].passed is True and v[1].evidence["results"] == ["fail", "pass"] and v[2].passed is None
    assert code.__name__ == "gfcr_code" and code.outcome is True
    math = reward_function("math", func_name="acc")
    assert math(prompts=["q", "q"], completions=["so \\boxed{1/2}", "Answer: 0.4"], answer=["0.5", "0.5"]) == [1.0, 0.0]
    fmt = reward_function("format", pattern=r"Answer:")
    assert fmt(prompts=["q"], completions=["Answer: 3"]) == [1.0] and fmt.outcome is False
