"""Builders for hand-made rollouts and runs used by the diagnose tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gfcr.records import Audit, Message, Rollout, Span


def rollout(
    run: str,
    step: int,
    group: str,
    reward: float,
    gen_len: int = 10,
    verified: bool | None = None,
    finish: str = "stop",
    signals: dict[str, float] | None = None,
    meta: dict[str, Any] | None = None,
    logprob: float = -1.0,
    text: str | None = None,
    prompt_len: int = 4,
    sample_index: int = 0,
    rollout_id: str | None = None,
) -> Rollout:
    """A rollout with ``prompt_len`` context tokens and ``gen_len`` generated tokens of log-prob ``logprob``."""
    n = prompt_len + gen_len
    role = np.array([0] * prompt_len + [1] * gen_len, np.uint8)
    lp = np.where(role == 1, logprob, 0.0).astype(np.float32)
    kw: dict[str, Any] = {}
    if rollout_id:
        kw["rollout_id"] = rollout_id
    return Rollout(
        run_id=run,
        prompt_id=group,
        group_id=f"{group}@{step}",
        step=step,
        sample_index=sample_index,
        task="arith",
        token_ids=np.arange(n, dtype=np.int32) % 50,
        token_role=role,
        logprobs=lp,
        messages=[Message("user", f"What is {group}?"), Message("assistant", text or f"answer {reward}")],
        reward=reward,
        verified=verified,
        finish_reason=finish,
        signals=signals or {},
        meta=meta or {},
        verifier={"name": "exact", "evidence": {"parsed": str(reward)}},
        **kw,
    )


def group(run: str, step: int, name: str, rewards: list[float], verified: list[bool | None] | None = None,
          **kw: Any) -> list[Rollout]:
    ver = verified if verified is not None else [None] * len(rewards)
    return [rollout(run, step, name, r, verified=v, sample_index=i, **kw) for i, (r, v) in enumerate(zip(rewards, ver, strict=True))]


def audit(r: Rollout, spans: list[tuple[int, int, str]], status: str = "kept", ter: float | None = None) -> Audit:
    mask = (np.asarray(r.token_role) == 1).astype(np.uint8)
    return Audit(
        rollout_id=r.rollout_id,
        judge="rule",
        judge_version="1",
        status=status,
        mask=mask,
        excluded=[Span(a, b, c) for a, b, c in spans],
        ter=ter,
        reason=None if status == "kept" else "wrong final answer",
    )


PATHOLOGIES = ("zero_reward", "reward_hacking", "length_inflation", "truncation", "signal_noise", "compute_waste",
               "long_tail", "replay_staleness", "entropy_collapse")


def simulate_run(kind: str, steps: int = 6, groups: int = 4, k: int = 4) -> list[Rollout]:
    """A run that is healthy except for the pathology ``kind`` ("healthy" for none).

    Healthy: every group half right (advantage ±0.5 consistent with the verifier), length 20,
    entropy 1.0, one replayed copy per step with lag 1 and importance weight 1.0.
    """
    run = kind
    out: list[Rollout] = []
    for t in range(steps):
        for gi in range(groups):
            rewards = [1.0 if (i + gi) % 2 == 0 else 0.0 for i in range(k)]
            if kind == "zero_reward":
                rewards = [0.0] * k
            if kind == "compute_waste" and gi > 0:
                rewards = [1.0] * k
            verified = [r > 0.5 for r in rewards]
            if kind == "reward_hacking" and t >= 2:
                rewards = [1.0] * k  # lenient reward passes everything, the strict verifier does not
            mean = sum(rewards) / k
            for i, (r, v) in enumerate(zip(rewards, verified, strict=True)):
                adv = r - mean
                if kind == "signal_noise" and gi == 0:
                    adv = -adv
                ent = 1.0
                if kind == "entropy_collapse":
                    ent = 2.0 * (0.6 ** t)
                gen_len = 20 + (10 * t if kind == "length_inflation" else 0) + i
                if kind == "long_tail" and gi == 0 and i == 0:
                    gen_len = 200  # one straggler per step holds the batch ten times as long
                finish = "length" if kind == "truncation" and i < 2 else "stop"
                out.append(rollout(run, t, f"p{gi}", r, gen_len=gen_len, verified=v, sample_index=i, finish=finish,
                                   signals={"advantage": adv, "entropy": ent}, logprob=-ent))
        lag, iw = (8.0, 0.2) if kind == "replay_staleness" else (1.0, 1.0)
        out.append(rollout(run, t, "p0", 1.0, verified=True, meta={"generated_at_step": max(0, t - 1)},
                           signals={"replayed": 1.0, "staleness": lag, "importance_weight": iw}))
    return out


#: pass ratios of the four groups of a step in the shaped code run: mixed, mixed, all failing, mixed
CODE_PASS_RATIOS = ([1.0, 0.8, 0.2, 0.0], [1.0, 1.0, 0.6, 0.4], [0.8, 0.6, 0.2, 0.0], [1.0, 0.5, 0.4, 0.0])


def simulate_shaped_run(kind: str, steps: int = 6, k: int = 4, max_tokens: int = 64) -> list[Rollout]:
    """A healthy run with reward shaping on, built with the project's own reward functions.

    ``code``: RLTF partial credit (``coderl_reward``, pass ratios :data:`CODE_PASS_RATIOS`), a 0.1
    format bonus on odd samples and DAPO's soft overlong penalty (buffer 16 of ``max_tokens``).
    ``length``: ShorterBetter's ``1[verified] − β·|len − SOL|`` with a 0.1 format bonus. GRPO
    advantages, steady entropy, lengths that vary but have no tail, one fresh replayed copy a step.
    """
    from gfcr.filters.reward import ShorterBetter
    from gfcr.filters.signals import dapo_overlong_penalty, grpo_advantages
    from gfcr.filters.verifiers import coderl_reward

    out: list[Rollout] = []
    run = f"shaped_{kind}"
    for t in range(steps):
        for gi, ratios in enumerate(CODE_PASS_RATIOS):
            ratios = ratios[:k]
            lens = [24 + 6 * i + 3 * gi + (t % 2) * 4 for i in range(k)]
            verified = [x >= 1.0 for x in ratios]
            fmt = [0.1 * (i % 2) for i in range(k)]
            if kind == "code":
                base = [coderl_reward("passed") if x >= 1.0 else coderl_reward("failed", x) for x in ratios]
                pen = dapo_overlong_penalty(lens, max_tokens, 16, 1.0)
                rewards = [b + f + float(p) for b, f, p in zip(base, fmt, pen, strict=True)]
            elif kind == "length":
                rewards = [float(v) + f for v, f in zip(ShorterBetter(beta=0.01).rewards(verified, lens), fmt, strict=True)]
            else:
                raise ValueError(kind)
            adv = grpo_advantages(rewards)
            for i in range(k):
                ent = 1.0 + 0.05 * ((t + i) % 3)
                out.append(rollout(run, t, f"p{gi}", rewards[i], gen_len=lens[i], verified=verified[i], sample_index=i,
                                   signals={"advantage": float(adv[i]), "entropy": ent}, logprob=-ent))
        out.append(rollout(run, t, "p0", 1.0, verified=True, meta={"generated_at_step": max(0, t - 1)},
                           signals={"replayed": 1.0, "staleness": 1.0, "importance_weight": 1.0}))
    return out


def _solution(a: int, b: int, right: bool, detour: bool, long: bool) -> str:
    s = a + b
    lines = [f"We need {a} + {b}."]
    if detour:
        lines += [f"First try: {a} + {b} = {s + 10}.", f"Check: {s + 10} - {b} = {s + 10 - b}, not {a}. That was wrong."]
    lines += [f"Ones: {a % 10} + {b % 10} = {a % 10 + b % 10}.", f"So {a} + {b} = {s if right else s - 1}."]
    if long:
        lines += [f"Let me double-check by counting up from {a}: " + ", ".join(str(a + i) for i in range(1, b + 1)) + "."]
    lines.append(f"Answer: {s if right else s - 1}")
    return "\n".join(lines)


def showcase_store(path: Any, tokenizer_dir: str, steps: int = 10, prompts: int = 4, k: int = 4,
                   run_id: str = "grpo-sums", seed: int = 7) -> Any:
    """A store that looks like a short GRPO run on two-digit sums, for the browser test and the docs'
    screenshots: real token ids from the tiny tokenizer saved in ``tokenizer_dir`` (recorded as the
    store's model in ``sampling.model``), partial credit for a near miss, DAPO-style dropped groups
    (``meta.trained``), a straggler now and then, one replayed copy per step and rule-judge audits
    (with excluded detours) on some passing rollouts. The trainer's recomputed log-probs
    (``meta.trainer_logprobs``, within 0.05 nats of the sampler's) ride along for the gap overlay.
    A second call with another ``run_id`` on the same path adds a second run."""
    import random

    from transformers import AutoTokenizer

    from gfcr.records import Audit, Span
    from gfcr.store import RolloutStore

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(seed)
    store = RolloutStore.open(path, create=True)
    rows: list[Rollout] = []
    audits: list[Audit] = []
    sums = [(rng.randint(10, 89), rng.randint(10, 89)) for _ in range(prompts * 3)]
    for t in range(steps):
        p_right = 0.3 + 0.5 * t / max(1, steps - 1)
        for gi in range(prompts):
            a, b = sums[(t * prompts + gi) % len(sums)]
            user = f"Compute {a} + {b}. Work it out step by step, then finish with a final line 'Answer: N'."
            chat = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)
            prompt_ids = tok(chat, add_special_tokens=False)["input_ids"]
            group_rows = []
            for i in range(k):
                right = rng.random() < p_right
                detour = rng.random() < 0.4
                long = gi == 0 and i == 0 and (t % 4 == 2 or t >= steps - 3)  # stragglers, more at the end
                text = _solution(a, b, right, detour, long)
                gen = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
                ids = list(prompt_ids) + gen
                role = [0] * len(prompt_ids) + [1] * len(gen)
                lp = [0.0] * len(prompt_ids) + [-0.2 - 0.8 * rng.random() for _ in gen]
                reward = 1.0 if right else (0.3 if detour else 0.0)  # partial credit for a worked check
                group_rows.append(Rollout(
                    run_id=run_id, prompt_id=f"sum-{a}-{b}", group_id=f"sum-{a}-{b}@{t}", step=t, sample_index=i,
                    task="arith", token_ids=np.asarray(ids, np.int32), token_role=np.asarray(role, np.uint8),
                    logprobs=np.asarray(lp, np.float32), policy_version=f"s{t}",
                    messages=[Message("user", user), Message("assistant", text)], reward=reward, verified=right,
                    finish_reason="stop", verifier={"name": "numeric", "version": "1", "passed": right,
                                                    "evidence": {"parsed": text.rsplit(" ", 1)[-1]}},
                    sampling={"engine": "hf", "model": tokenizer_dir, "temperature": 0.7, "max_tokens": 256},
                    signals={"entropy": 1.1 - 0.04 * t + 0.1 * rng.random()}))
            rewards = [r.reward for r in group_rows]
            mean = sum(rewards) / k
            keep = max(rewards) - min(rewards) > 1e-9
            for r in group_rows:
                r.signals["advantage"] = r.reward - mean
                lp = np.asarray(r.logprobs, float)
                gap = np.where(np.asarray(r.token_role) == 1, [0.05 * (rng.random() - 0.5) for _ in lp], 0.0)
                r.meta = {"trained": keep, "trainer_logprobs": np.minimum(lp + gap, 0.0).round(4).tolist()}
                if r.verified and "First try" in r.completion and len(audits) < 12:
                    text = r.completion
                    a0 = text.index("First try")
                    a1 = text.index("That was wrong.") + len("That was wrong.") + 1
                    # supervised = generated tokens wholly outside the excluded characters (the ROSS rule)
                    mask = (np.asarray(r.token_role) == 1).astype(np.uint8)
                    gen_idx = np.nonzero(mask)[0]
                    offsets = tok(text + "<|im_end|>", add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
                    for j, (c0, c1) in zip(gen_idx, offsets, strict=True):
                        if c1 > a0 and c0 < a1:
                            mask[j] = 0
                    n_out = int((mask[gen_idx] == 0).sum())
                    audits.append(Audit(rollout_id=r.rollout_id, judge="arith-steps", judge_version="1", status="kept",
                                        mask=mask, excluded=[Span(a0, a1, "corrected_mistake")],
                                        ter=n_out / len(gen_idx)))
            rows += group_rows
        src = rows[-1]
        rows.append(Rollout(**{**src.__dict__, "rollout_id": f"replay-{run_id}-{t}", "step": t + 1 if t + 1 < steps else t,
                               "signals": {"replayed": 1.0, "staleness": 1.0 + t % 3, "importance_weight": 0.9},
                               "meta": {"generated_at_step": t}}))
    store.append(rows)
    store.upsert_audits(audits)
    return store


def random_batch(rng: np.random.Generator, n: int) -> list:
    """``n`` rollouts over 2 runs x 3 steps and a few groups each, with everything the metrics read
    drawn at random: rewards repeated or missing, verdicts, advantages, entropies, replayed copies,
    ``trained`` flags, finish reasons, latencies (shared, distinct, missing), tasks, models."""
    from gfcr.records import Cost

    out = []
    rewards = [0.0, 0.25, 0.5, 1.0, -0.5, None]
    for i in range(n):
        run, step, grp = f"r{rng.integers(2)}", int(rng.integers(3)), f"g{rng.integers(max(1, n // 6))}"
        sig: dict[str, float] = {}
        if rng.random() < 0.7:
            sig["advantage"] = float(rng.choice([0.0, 1e-7, 0.5, -0.5, float(rng.normal())]))
        if rng.random() < 0.5:
            sig["entropy"] = float(rng.random())
        if rng.random() < 0.1:
            sig["replayed"] = 1.0
        meta = {"trained": bool(rng.random() < 0.5)} if rng.random() < 0.3 else {}
        r = rollout(run, step, grp, 0.0, gen_len=int(rng.integers(0, 40)), finish=str(rng.choice(["stop", "length", "abort"])),
                    verified=[None, True, False][int(rng.integers(3))], signals=sig, meta=meta, sample_index=i,
                    rollout_id=f"id{int(rng.integers(10**6)):06d}-{i}")
        r.reward = rewards[int(rng.integers(len(rewards)))] if rng.random() < 0.8 else float(rng.random())
        if rng.random() < 0.5:
            r.cost = Cost(gen_tokens=len(r.token_ids), latency_s=float(rng.choice([0.0, 1.5, rng.random() * 10])))
        r.task = ["arith", "code", "zeta"][int(rng.integers(3))]
        r.sampling = [{}, {"model": "m-a"}, {"model": "m-b", "temperature": 0.7}, {"model": None}][int(rng.integers(4))]
        out.append(r)
    return out


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b
