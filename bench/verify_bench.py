"""Verification throughput: verdicts/s for the math and code verifiers, 1 vs 2 workers.

Run: .venv/bin/python bench/verify_bench.py [--n-math 200] [--n-code 40]
The ratio (2 workers / 1 worker) is the number to watch; absolute rates depend on the machine.
Math workers are warmed up before timing (start-up and the math-verify import are excluded).
"""

from __future__ import annotations

import argparse
import random
import time

from gfcr.filters import verify_many
from gfcr.filters.verifiers import get_verifier
from gfcr.records import Message, Prompt, Rollout


def _rollouts(prompts: list[Prompt], texts: list[str]) -> list[Rollout]:
    return [
        Rollout(run_id="bench", prompt_id=p.prompt_id, task=p.task, token_ids=[1], token_role=[1], logprobs=[0.0],
                messages=[Message("assistant", t)])
        for p, t in zip(prompts, texts, strict=True)
    ]


def math_workload(n: int, rng: random.Random) -> tuple[list[Rollout], list[Prompt]]:
    prompts, texts = [], []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(2, 99)
        gold = f"\\frac{{{a}}}{{{b}}}"
        prompts.append(Prompt(prompt_id=f"m{i}", task="math", messages=[Message("user", "q")], answer=gold))
        k = rng.choice([1, 2, 3])
        pred = f"\\frac{{{a * k}}}{{{b * k}}}" if rng.random() < 0.6 else f"{a / b + 0.5:.4f}"
        texts.append(f"Some reasoning.\nSo the answer is \\boxed{{{pred}}}")
    return _rollouts(prompts, texts), prompts


def code_workload(n: int) -> tuple[list[Rollout], list[Prompt]]:
    prompts, texts = [], []
    tests = [f"assert fib({k}) == {v}" for k, v in [(0, 0), (1, 1), (5, 5), (10, 55), (20, 6765)]]
    good = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    bad = "def fib(n):\n    return n\n"
    for i in range(n):
        prompts.append(Prompt(prompt_id=f"c{i}", task="code", messages=[Message("user", "fib")], tests=tests))
        texts.append(f"```python\n{good if i % 2 == 0 else bad}```")
    return _rollouts(prompts, texts), prompts


def rate(rollouts: list[Rollout], prompts: list[Prompt], name: str, workers: int) -> float:
    v = get_verifier(name)
    t0 = time.perf_counter()
    out = verify_many(rollouts, v, prompts, workers=workers)
    dt = time.perf_counter() - t0
    assert all(r.verified is not None for r in out)
    return len(out) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-math", type=int, default=200)
    ap.add_argument("--n-code", type=int, default=40)
    args = ap.parse_args()
    rng = random.Random(0)
    mr, mp = math_workload(args.n_math, rng)
    cr, cp = code_workload(args.n_code)
    verify_many(mr[:4], "math", mp, workers=2)  # warm both math workers
    print(f"{'verifier':8} {'n':>5} {'1 worker/s':>11} {'2 workers/s':>12} {'ratio':>6}")
    for name, rs, ps in (("math", mr, mp), ("code", cr, cp)):
        # alternate 1 and 2 workers twice, keep the best of each: caches and CPU noise hit both alike
        r1 = r2 = 0.0
        for _ in range(2):
            r1 = max(r1, rate(rs, ps, name, 1))
            r2 = max(r2, rate(rs, ps, name, 2))
        print(f"{name:8} {len(rs):5d} {r1:11.1f} {r2:12.1f} {r2 / r1:6.2f}")


if __name__ == "__main__":
    main()
