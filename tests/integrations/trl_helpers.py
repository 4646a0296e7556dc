"""Tiny GRPOTrainer set-ups shared by the TRL integration tests and the recorder bench."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def arith_dataset(n: int = 8, category: bool = True) -> Any:
    from datasets import Dataset

    rows = []
    for i in range(n):
        a, b = i + 1, 2 * i + 3
        row = {"prompt": [{"role": "user", "content": f"What is {a} + {b}? End with 'Answer: N'."}],
               "answer": str(a + b)}
        if category:
            row["category"] = "small" if i % 2 else "big"
        rows.append(row)
    return Dataset.from_list(rows)


def make_trainer(output_dir: str, reward_funcs: list, *, max_steps: int = 2, per_device: int = 4,
                 num_generations: int = 2, steps_per_generation: int | None = None, max_completion_length: int = 8,
                 dataset: Any = None, reward_weights: list[float] | None = None, hidden: int = 64, layers: int = 2,
                 log_completions: bool = False, seed: int = 0, **extra: Any) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    from gfcr.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=seed, hidden=hidden, layers=layers)
    args = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=per_device, num_generations=num_generations,
        max_completion_length=max_completion_length, max_steps=max_steps, logging_steps=1, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", seed=seed, temperature=1.0, gradient_checkpointing=False,
        dataloader_num_workers=0, steps_per_generation=steps_per_generation, reward_weights=reward_weights,
        log_completions=log_completions, num_completions_to_print=0, disable_tqdm=True, **extra,
    )
    return GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward_funcs, args=args,
                       train_dataset=dataset if dataset is not None else arith_dataset())
