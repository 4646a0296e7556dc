"""Multi-turn evaluation (`gfcr.evaluate.evaluate_episodes`) on a scripted engine whose episodes are
known in advance, so pass@k / greedy can be worked out by hand; and `gfcr eval --env` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gfcr.evaluate import evaluate_episodes
from gfcr.generate.engines.base import GenResult
from gfcr.generate.topologies import derive_seed
from gfcr.records import Message, Prompt
from gfcr.testing import save_tiny, tiny_tokenizer

CALL = "Let me compute <calc>3 + 4</calc>"


class ScriptedEngine:
    """Answers from a script: turn 0 of every episode is a calculator call, turn 1 is
    ``final[prompt_id][i]`` (sampled episode ``i``) or ``greedy[prompt_id]`` (temperature 0).
    The episode is recovered from the request's seed, which ``MultiTurn`` derives from
    ``(seed, prompt_id, step, "turn", turn, i)``."""

    name = "scripted"
    policy_version = "scripted-v0"

    def __init__(self, final: dict[str, list[str]], greedy: dict[str, str], seed: int = 0, first: str = CALL):
        self.tokenizer = tiny_tokenizer()
        self.final, self.greedy, self.first = final, greedy, first
        k = max(len(v) for v in final.values())
        self.by_seed = {derive_seed(seed, pid, 0, "turn", turn, i): (pid, turn, i)
                        for pid in final for turn in range(8) for i in range(k)}
        self.calls = 0

    def generate(self, requests):
        self.calls += 1
        out = []
        for req in requests:
            pid, turn, i = self.by_seed[req.params.seed]
            if turn == 0:
                text = self.first
            else:
                text = self.greedy[pid] if req.params.temperature == 0 else self.final[pid][i]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([GenResult(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.5, np.float32),
                                  finish_reason="stop")])
        return out


def _prompt(pid: str, answer: str | None) -> Prompt:
    return Prompt(prompt_id=pid, task="arith", messages=[Message("user", f"What is 3 + 4? ({pid})")], answer=answer)


# prompt A (gold 7) and B (gold 5): which final turns the verifier (numeric, lenient: last number) and the
# calculator env (an explicit <answer>/Answer: line equal to the gold) accept
FINAL = {
    "A": ["<answer>7</answer>",  # verifier yes, env yes
          "<answer>8</answer>",  # no, no
          "so it is 7",          # yes, no (no explicit answer)
          "Answer: 7"],          # yes, yes
    "B": ["<answer>4</answer>",  # no, no
          "maybe 5",             # yes, no
          "<answer>6</answer>",  # no, no
          "<answer>5</answer>"],  # yes, yes
}
GREEDY = {"A": "<answer>7</answer>", "B": "5"}  # A: yes, yes; B: yes, no


def _run(source: str, **kw):
    engine = ScriptedEngine(FINAL, GREEDY)
    prompts = [_prompt("A", "7"), _prompt("B", "5")]
    res = evaluate_episodes(engine, prompts, env="calculator", max_turns=3, k=4, ks=[1, 2, 4], verifier="numeric",
                            reward_source=source, n_boot=200, **kw)
    return res, engine


def test_pass_at_k_of_episodes_judged_by_the_verifier():
    res, engine = _run("verifier")
    # A: 3 of 4 correct, B: 2 of 4. pass@1 = (3/4 + 2/4)/2; pass@2: A = 1 (one failure < 2), B = 1 - C(2,2)/C(4,2) = 5/6
    assert res.metrics["pass@1"].value == pytest.approx(0.625)
    assert res.metrics["pass@2"].value == pytest.approx((1 + 5 / 6) / 2)
    assert res.metrics["pass@4"].value == pytest.approx(1.0)
    assert res.metrics["avg@4"].value == pytest.approx(0.625)
    assert res.metrics["greedy_pass@1"].value == pytest.approx(1.0)
    assert {p["prompt_id"]: p["correct"] for p in res.per_prompt} == {"A": 3, "B": 2}
    # two turns per episode (call, answer); the answer turn ends the episode: env_done
    assert res.info["env"] == "calculator" and res.info["max_turns"] == 3 and res.info["reward_source"] == "verifier"
    assert res.info["turns_mean"] == 2.0 and res.info["finish_reasons"] == {"env_done": 10}
    assert res.info["env_signal_share"] == 1.0
    assert engine.calls == 4  # two turns x (sampled, greedy): one engine call per turn for all episodes


def test_pass_at_k_of_episodes_judged_by_the_env():
    res, _ = _run("env")
    # A: 2 of 4 (i0, i3), B: 1 of 4 (i3). pass@2: A = 1 - C(2,2)/C(4,2) = 5/6, B = 1 - C(3,2)/C(4,2) = 1/2
    assert res.metrics["pass@1"].value == pytest.approx(0.375)
    assert res.metrics["pass@2"].value == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert res.metrics["pass@4"].value == pytest.approx(1.0)
    assert res.metrics["greedy_pass@1"].value == pytest.approx(0.5)
    lo, hi = res.metrics["pass@1"].ci_low, res.metrics["pass@1"].ci_high
    assert 0.25 <= lo <= 0.375 <= hi <= 0.5  # bootstrap over the two prompts' values 1/2 and 1/4


def test_weighted_source_passes_only_when_both_judges_pass():
    res, _ = _run("weighted", env_weight=0.3)
    assert {p["prompt_id"]: p["correct"] for p in res.per_prompt} == {"A": 2, "B": 1}


def test_env_without_gold_reports_nothing_so_env_source_fails_and_env_or_verifier_falls_back():
    engine = ScriptedEngine({"C": ["<answer>7</answer>", "so 7"]}, {"C": "7"})
    prompts = [_prompt("C", None)]
    always = lambda p, text: True  # noqa: E731 - a verifier that accepts everything

    env_only = evaluate_episodes(engine, prompts, env="calculator", k=2, verifier=always, reward_source="env",
                                 n_boot=50)
    assert env_only.metrics["pass@1"].value == 0.0 and env_only.info["env_signal_share"] == 0.0
    fallback = evaluate_episodes(engine, prompts, env="calculator", k=2, verifier=always,
                                 reward_source="env_or_verifier", n_boot=50)
    assert fallback.metrics["pass@2"].value == 1.0 and fallback.metrics["greedy_pass@1"].value == 1.0


def test_max_turns_cuts_episodes_and_bad_arguments_fail():
    # max_turns=1: the episode ends after the calculator call, never reaching an answer
    engine = ScriptedEngine(FINAL, GREEDY)
    res = evaluate_episodes(engine, [_prompt("A", "7")], env="calculator", max_turns=1, k=2, verifier="numeric",
                            reward_source="env", n_boot=50)
    assert res.metrics["pass@2"].value == 0.0 and res.info["finish_reasons"] == {"length": 3}
    with pytest.raises(ValueError, match="reward_source"):
        evaluate_episodes(engine, [_prompt("A", "7")], env="calculator", reward_source="judge")
    with pytest.raises(ValueError, match="unknown env"):
        evaluate_episodes(engine, [_prompt("A", "7")], env="no_such_env", k=1)
    with pytest.raises(ValueError, match="max_turns"):
        evaluate_episodes(engine, [_prompt("A", "7")], env="calculator", max_turns=0)


def test_gfcr_eval_with_env_end_to_end(tmp_path):
    model = save_tiny(str(tmp_path / "model"))
    out = tmp_path / "eval.json"
    cli = [sys.executable, "-m", "gfcr.cli", "eval", "--model", model, "--tasks", "arith", "--task-arg", "level=1",
           "--n", "2", "--k", "2", "--max-tokens", "6"]
    proc = subprocess.run([*cli, "--env", "calculator", "--max-turns", "2", "--reward-source", "env_or_verifier",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["n_prompts"] == 2 and d["n_samples"] == 2
    assert set(d["metrics"]) == {"pass@1", "pass@2", "avg@2", "greedy_pass@1"}
    assert d["info"]["env"] == "calculator" and d["info"]["max_turns"] == 2
    assert d["info"]["reward_source"] == "env_or_verifier" and 1.0 <= d["info"]["turns_mean"] <= 2.0
    assert sum(d["info"]["finish_reasons"].values()) == 2 * 2 + 2  # sampled + greedy episodes
    # unbiased pass@1 is the mean per-sample accuracy, which the per-prompt counts give
    acc = np.mean([p["correct"] / 2 for p in d["per_prompt"]])
    assert d["metrics"]["pass@1"]["value"] == pytest.approx(acc) == pytest.approx(d["metrics"]["avg@2"]["value"])

    bad = subprocess.run([*cli, "--env", "no_such_env"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no_such_env" in bad.stderr
    stray = subprocess.run([*cli, "--max-turns", "3"], capture_output=True, text=True, timeout=120)
    assert stray.returncode == 2 and "--env" in stray.stderr
