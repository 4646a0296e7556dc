"""Generate the TRL generation-reuse fixture with TRL's own GRPOTrainer (not run in CI).

Framework: trl 1.16.0 (PyPI), transformers 5.24.0, torch 2.13.0+cpu. Run on demand, with TRL
installed outside the project's venv, e.g.

    pip install --no-deps --target /tmp/trlpkgs 'trl==1.16.0'
    PYTHONPATH=src:/tmp/trlpkgs python tests/contracts/gen_trl_reuse.py tests/contracts/fixtures/trl_reuse

`GRPOConfig(num_iterations=2, logging_steps=1, log_completions=True)`, 4 optimizer steps. TRL
regenerates only every ``steps_per_generation * num_iterations`` micro-steps
(``GRPOTrainer._prepare_inputs``), while ``GRPOTrainer.log`` writes its ``_logs`` deque (the last
``generation_batch_size`` rows) at every logging step, with ``step = state.global_step`` at log
time: so `completions_00002.parquet` repeats the batch of `_00001` (and `_00004` that of `_00003`).
``training_args.bin`` (``Trainer.save_model``) is kept beside ``completions/``: gfcr reads the
reuse from it, never from equal content alone.
The policy is a tiny random Llama whose `generate` is scripted (varied answers, so rewards differ);
everything else is TRL's. ``expected.json`` records, from inside TRL, each call of
``_generate_and_score_completions``: ``state.global_step`` at that moment (the step a live recorder
stores) and the completions it produced.
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
    calls = {"n": 0}

    def scripted_generate(input_ids=None, attention_mask=None, **_):
        rows = []
        for row, ids in enumerate(input_ids):
            q = tok.decode(ids.tolist()).rsplit("What is ", 1)[-1].split("?")[0]
            a, b = (int(x) for x in q.split(" + "))
            calls["n"] += 1
            wrong = (row + calls["n"]) % 3 == 0
            rows.append(tok(f"It is {a + b + (1 if wrong else 0)} (try {calls['n']}).", add_special_tokens=False)["input_ids"]
                        + [tok.eos_token_id])
        width = max(len(r) for r in rows)
        pad = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(pad, dtype=input_ids.dtype)], dim=1)

    model.generate = scripted_generate

    def accuracy_reward(completions, answer, **_):
        return [1.0 if f" {a} " in c[-1]["content"] else 0.0 for c, a in zip(completions, answer, strict=True)]

    qs = [(2, 3), (4, 5), (1, 1), (6, 1)]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
                            for a, b in qs])
    generated = []
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=4, per_device_train_batch_size=4, num_generations=2, num_iterations=2,
            logging_steps=1, log_completions=True, max_completion_length=64, report_to=[], use_cpu=True,
            bf16=False, save_strategy="no", seed=0, shuffle_dataset=False, gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[accuracy_reward], args=args, train_dataset=ds,
                              processing_class=tok)
        orig = trainer._generate_and_score_completions

        def spy(batch):
            step = int(trainer.state.global_step)
            res = orig(batch)
            n = len(trainer._logs["completion"])
            comps = list(trainer._logs["completion"])[-args.generation_batch_size:]
            generated.append({"global_step": step, "completions": [c[-1]["content"] for c in comps], "deque": n})
            return res

        trainer._generate_and_score_completions = spy
        trainer.train()
        trainer.save_model(tmp)  # writes training_args.bin (the GRPOConfig), as a real run's output_dir holds it
        dst = Path(out) / "completions"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted((Path(tmp) / "completions").glob("*.parquet")):
            (dst / f.name).write_bytes(f.read_bytes())
        (Path(out) / "training_args.bin").write_bytes((Path(tmp) / "training_args.bin").read_bytes())
    import trl

    (Path(out) / "expected.json").write_text(json.dumps(
        {"trl": trl.__version__, "generation_batch_size": args.generation_batch_size, "generations": generated},
        indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/trl_reuse")
