"""Overhead of the gfcr live recorder on a TRL GRPOTrainer step, side by side.

    python bench/trl_recorder_bench.py                      # random Llama (hidden 256, 4 layers), CPU
    python bench/trl_recorder_bench.py --model default      # SmolLM2-135M-Instruct (slow on CPU)

Two arms, alternated (AB, BA, AB, ...) in one process: ``off`` (a plain GRPOTrainer) and ``on``
(the same trainer with :class:`gfcr.integrations.trl.TRLRecorder` attached); both use the same seed
and the same gfcr reward function. Each round trains a fresh trainer for ``--steps`` optimizer
steps; the first step of every run is dropped (warm-up), the rest are the samples. Per step: wall
seconds and process CPU seconds (every thread, so the writer thread's and Lance's work is counted),
from ``on_step_begin`` to ``on_step_end``. Reported: medians per arm and the ratio of the medians;
the median of the paired per-step ratios (same seed, so step j of round r does the same work in
both arms) with a 95% bootstrap interval; the training-thread time the recorder took per step; the
writer thread's wall and CPU per step; how long ``close()`` waited for the writer at the end of a
run; the machine's load average before and after.
Goal: median step time with the recorder <= 1.03 x without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def dataset(n: int):
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": [{"role": "user", "content": f"What is {i} + {i + 7}? End with 'Answer: N'."}],
         "answer": str(2 * i + 7)} for i in range(n)])


def build(args, out_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gfcr.integrations.trl import reward_function
    from gfcr.testing import tiny_model, tiny_tokenizer

    if args.model == "tiny":
        tok = tiny_tokenizer()
        model = tiny_model(tok, seed=0, hidden=args.hidden, layers=args.layers)
    else:
        from gfcr.models import resolve_model

        path = resolve_model(args.model)
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=args.batch, num_generations=args.k,
        max_completion_length=args.tokens, max_steps=args.steps, logging_steps=10_000, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", seed=0, temperature=1.0, disable_tqdm=True,
        dataloader_num_workers=0)
    return GRPOTrainer(model=model, processing_class=tok, args=cfg, train_dataset=dataset(64),
                       reward_funcs=[reward_function("format", pattern=r"Answer:\s*\d")])


def run_arm(args, arm: str, root: str) -> dict:
    from transformers import TrainerCallback

    from gfcr.integrations.trl import TRLRecorder
    from gfcr.store import RolloutStore

    d = tempfile.mkdtemp(dir=root)
    trainer = build(args, os.path.join(d, "out"))
    steps: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):  # noqa: ANN001
            self.t, self.c = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, control, **kw):  # noqa: ANN001
            steps.append((time.perf_counter() - self.t, time.process_time() - self.c))

    trainer.add_callback(Clock())
    rec = None
    if arm == "on":
        rec = TRLRecorder(RolloutStore.open(os.path.join(d, "store"), create=True), "bench")
        rec.attach(trainer)
        close = rec.close

        def timed_close():
            t0 = time.perf_counter()
            close()
            rec.close_wait_s = time.perf_counter() - t0

        rec.close = timed_close
    trainer.train()
    res = {"arm": arm, "steps": steps[1:]}
    if rec is not None:
        n = max(len(steps), 1)
        res.update(capture_s=rec.capture_s / n, capture_cpu_s=rec.capture_cpu_s / n, writer_wall_s=rec.writer.stats["write_s"] / n,
                   writer_cpu_s=rec.writer.stats["cpu_s"] / n, close_wait_s=getattr(rec, "close_wait_s", None),
                   rows=rec.writer.stats["rows"])
    return res


def bootstrap_ci(xs: list[float], n: int = 2000, seed: int = 0) -> list[float]:
    """95% bootstrap interval of the median of ``xs``."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n) - 1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (random Llama), 'default' (SmolLM2-135M) or a path")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="per-device train batch (rows per step)")
    ap.add_argument("--k", type=int, default=4, help="num_generations")
    ap.add_argument("--tokens", type=int, default=48, help="max_completion_length")
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is dropped)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs both arms, order alternating")
    ap.add_argument("--out", default=None, help="also write the result JSON here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(prefix="gfcr-trl-bench-")
    results: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):
            results[arm].append(run_arm(args, arm, root))
            print(f"round {r} {arm}: median step {statistics.median(s[0] for s in results[arm][-1]['steps']):.3f}s",
                  flush=True)
    med = {}
    for arm, runs in results.items():
        walls = [s[0] for run in runs for s in run["steps"]]
        cpus = [s[1] for run in runs for s in run["steps"]]
        med[arm] = {"median_wall_s": statistics.median(walls), "median_cpu_s": statistics.median(cpus),
                    "n_steps": len(walls)}
    on = results["on"]
    # same seed in both arms, so step j of round r does the same work in each: pair them
    pairs = [a[0] / b[0] for ron, roff in zip(results["on"], results["off"], strict=True)
             for a, b in zip(ron["steps"], roff["steps"], strict=False)]
    cpu_pairs = [a[1] / b[1] for ron, roff in zip(results["on"], results["off"], strict=True)
                 for a, b in zip(ron["steps"], roff["steps"], strict=False)]
    out = {
        "config": vars(args),
        "off": med["off"], "on": med["on"],
        "ratio_wall": med["on"]["median_wall_s"] / med["off"]["median_wall_s"],
        "ratio_cpu": med["on"]["median_cpu_s"] / med["off"]["median_cpu_s"],
        "paired_ratio_wall_median": statistics.median(pairs), "paired_ratio_wall_ci95": bootstrap_ci(pairs),
        "paired_ratio_cpu_median": statistics.median(cpu_pairs), "paired_ratio_cpu_ci95": bootstrap_ci(cpu_pairs),
        "recorder_training_thread_s_per_step": statistics.median(x["capture_s"] for x in on),
        "recorder_training_thread_cpu_s_per_step": statistics.median(x["capture_cpu_s"] for x in on),
        "writer_wall_s_per_step": statistics.median(x["writer_wall_s"] for x in on),
        "writer_cpu_s_per_step": statistics.median(x["writer_cpu_s"] for x in on),
        "close_wait_s": statistics.median(x["close_wait_s"] for x in on),
        "rows_per_run": on[0]["rows"],
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "cpus": os.cpu_count(),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
