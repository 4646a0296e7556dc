"""Generate the TRL collapsed-policy fixture with TRL's own GRPOTrainer (not run in CI).

Framework: trl 1.16.0 (PyPI), transformers 5.24.0, torch 2.13.0+cpu. Run on demand, with TRL
installed (e.g. in the project's dev venv or ``pip install --no-deps --target /tmp/trlpkgs
'trl==1.16.0'``):

    PYTHONPATH=src python tests/contracts/gen_trl_collapse.py tests/contracts/fixtures/trl_collapse

`GRPOConfig(num_iterations=1, logging_steps=1, log_completions=True)`, 3 optimizer steps over a
2-prompt dataset (one epoch per step, unshuffled), so every step samples the same two prompts. The
policy has collapsed: its scripted `generate` answers every prompt with the same text, the one
reward function gives 1.0 to all, every advantage is 0. So TRL logs three files whose rows are
identical but for ``step``: 12 rollouts, each generated once (TRL generated at every step:
``expected.json`` records each ``_generate_and_score_completions`` call from inside TRL). The
trainer's ``save_model`` writes ``training_args.bin`` (the pickled ``GRPOConfig``) beside
``completions/``, as a real run's output folder holds it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch


def main(out: str) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from gfcr.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok)

    def collapsed_generate(input_ids=None, attention_mask=None, **_):
        row = tok("It is 5.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return torch.cat([input_ids, torch.tensor([row] * len(input_ids), dtype=input_ids.dtype)], dim=1)

    model.generate = collapsed_generate

    def constant_reward(completions, **_):
        return [1.0 for _ in completions]

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}]} for a, b in [(2, 3), (1, 4)]])
    generated = []
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=3, per_device_train_batch_size=4, num_generations=2, num_iterations=1,
            logging_steps=1, log_completions=True, max_completion_length=16, report_to=[], use_cpu=True,
            bf16=False, save_strategy="no", seed=0, shuffle_dataset=False, gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[constant_reward], args=args, train_dataset=ds,
                              processing_class=tok)
        orig = trainer._generate_and_score_completions

        def spy(batch):
            step = int(trainer.state.global_step)
            res = orig(batch)
            comps = list(trainer._logs["completion"])[-args.generation_batch_size:]
            generated.append({"global_step": step, "completions": [c[-1]["content"] for c in comps]})
            return res

        trainer._generate_and_score_completions = spy
        trainer.train()
        trainer.save_model(tmp)
        dst = Path(out) / "completions"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted((Path(tmp) / "completions").glob("*.parquet")):
            (dst / f.name).write_bytes(f.read_bytes())
        (Path(out) / "training_args.bin").write_bytes((Path(tmp) / "training_args.bin").read_bytes())
    import trl

    (Path(out) / "expected.json").write_text(json.dumps(
        {"trl": trl.__version__, "num_iterations": args.num_iterations, "steps_per_generation": args.steps_per_generation,
         "generation_batch_size": args.generation_batch_size, "generations": generated}, indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/trl_collapse")
