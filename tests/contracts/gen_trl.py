"""Generate the TRL contract fixture by running TRL's own GRPOTrainer (not run in CI).

Framework: trl 1.16.0 (PyPI), transformers 5.24.0, torch 2.13.0+cpu. Run on demand, in a separate
environment that has the `contracts` extra installed (never the project's own venv):

    python -m venv /tmp/fixvenv && /tmp/fixvenv/bin/pip install torch==2.13.0 'trl==1.16.0'
    PYTHONPATH=src /tmp/fixvenv/bin/python tests/contracts/gen_trl.py tests/contracts/fixtures/trl

What runs is TRL's code end to end: `GRPOTrainer(log_completions=True)` with two reward functions
(weights 1.0 and 0.5; the second returns None for one prompt), a reward function that calls
`log_extra` with a numeric and a string column, a tool (`add`) and the Qwen2.5 chat template TRL
ships (so TRL's own `add_response_schema` / `parse_response` parse the tool calls and
`_tool_call_loop` runs the tool). The policy is a tiny random Llama whose `generate` is scripted
(it emits a fixed tool call or answer), because a random model never writes a tool call; the token
ids, decoding, tool execution, rewards, advantages and the parquet writer are TRL's. Writes
`completions/completions_00001.parquet` and `_00002.parquet` and `expected.json` (the rewards TRL
trained on, recomputed from its own columns and weights), then prints the file list.
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
    from trl import chat_template_utils as ctu

    from gfcr.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tok.chat_template = ctu.qwen2_5_chat_template
    model = tiny_model(tok)

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first integer
            b: second integer
        """
        return a + b

    def scripted_generate(input_ids=None, attention_mask=None, **_):
        rows = []
        for row, ids in enumerate(input_ids):
            text = tok.decode(ids.tolist())
            q = text.rsplit("What is ", 1)[-1].split("?")[0]
            a, b = (int(x) for x in q.split(" + "))
            if "<tool_response>" in text:
                reply = f"The answer is {a + b}.<|im_end|>"
            elif row % 2:  # the second sample of each group answers wrongly
                reply = f"It is {a + b + 1}.<|im_end|>"
            elif a % 2 == 0:  # even first operand: call the tool first
                call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
                reply = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
            else:
                reply = f"The answer is {a + b}.<|im_end|>"
            rows.append(tok(reply, add_special_tokens=False)["input_ids"])
        width = max(len(r) for r in rows)
        pad = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(pad, dtype=input_ids.dtype)], dim=1)

    model.generate = scripted_generate

    def accuracy_reward(completions, answer, log_extra=None, **_):
        finals = [c[-1]["content"] for c in completions]
        if log_extra is not None:
            log_extra("n_chars", [float(len(f)) for f in finals])
            log_extra("pred", [f.rsplit(" ", 1)[-1].rstrip(".") for f in finals])
        return [1.0 if f.rstrip(".").endswith(" " + a) else 0.0 for f, a in zip(finals, answer, strict=True)]

    def format_reward(completions, answer, **_):
        return [None if a == "9" else (0.4 if c[-1]["content"].endswith(".") else -0.4)
                for c, a in zip(completions, answer, strict=True)]

    qs = [(2, 3), (4, 5), (1, 1), (6, 1)]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
                            for a, b in qs])
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=2, per_device_train_batch_size=4, num_generations=2, logging_steps=1,
            log_completions=True, max_completion_length=256, reward_weights=[1.0, 0.5], report_to=[],
            use_cpu=True, bf16=False, save_strategy="no", seed=0, shuffle_dataset=False,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[accuracy_reward, format_reward], args=args,
                              train_dataset=ds, processing_class=tok, tools=[add])
        trainer.train()
        dst = Path(out) / "completions"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted((Path(tmp) / "completions").glob("*.parquet")):
            (dst / f.name).write_bytes(f.read_bytes())
    import pandas as pd
    import trl

    expected = []
    for f in sorted(dst.glob("*.parquet")):
        df = pd.read_parquet(f)
        for i, row in df.iterrows():
            acc, fmt = row["accuracy_reward"], row["format_reward"]
            reward = 1.0 * acc + (0.0 if pd.isna(fmt) else 0.5 * fmt)
            expected.append({"file": f.name, "row": int(i), "reward": reward, "advantage": float(row["advantage"]),
                             "n_chars": float(row["n_chars"]), "pred": row["pred"],
                             "roles": [m["role"] for m in row["completion"]]})
    (Path(out) / "expected.json").write_text(json.dumps({"trl": trl.__version__, "rows": expected}, indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/trl")
