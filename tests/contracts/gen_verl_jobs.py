"""Generate the two-experiment verl fixture with verl's own dump writer (not run in CI).

Framework: verl 0.9.1 (PyPI wheel, unpacked; put it on ``PYTHONPATH``). The writer
``RayPPOTrainer._write_generations`` is taken from ``verl/trainer/ppo/ray_trainer.py`` exactly as
``gen_verl.py`` does and run as is, once per experiment, each into its own ``rollout_data_dir``
under one parent: ``exp-a/1.jsonl`` and ``exp-b/1.jsonl`` (the same file name), whose first rows
are identical. The ``input`` strings are what verl logs: the prompt after the chat template,
decoded (``tokenizer.batch_decode(prompts, skip_special_tokens=True)``, ray_trainer.py), for a
tokenizer whose turn marks are not special tokens, so they survive the decode. They are rendered
by ``transformers``' ``apply_chat_template`` with a ChatML template (Qwen's layout:
``<|im_start|>role\\n…<|im_end|>\\n``, generation prompt ``<|im_start|>assistant\\n``) for exp-a and a
Llama-3 header template for exp-b. Run:

    PYTHONPATH=src:/tmp/wheels/x/verl python tests/contracts/gen_verl_jobs.py tests/contracts/fixtures/verl_jobs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def main(out: str) -> None:
    from importlib.metadata import version

    from gen_verl import _load, _write_generations

    from gfcr.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    write = _write_generations()
    dapo = _load("utils/reward_score/math_dapo.py")
    convs = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3? Use \\boxed{}."}],
             [{"role": "user", "content": "What is 6 * 7? Use \\boxed{}."}]]
    gts = ["5", "42"]
    runs = {"exp-a": (CHATML, [["\\boxed{5}", "\\boxed{6}"], ["\\boxed{42}", "\\boxed{41}"]]),
            "exp-b": (LLAMA3, [["\\boxed{5}", "\\boxed{4}"], ["\\boxed{42}", "\\boxed{40}"]])}
    for name, (tpl, outs) in runs.items():
        inputs, outputs, golds, scores, extra = [], [], [], [], {}
        for conv, os_, g in zip(convs, outs, gts, strict=True):
            p = tok.apply_chat_template(conv, chat_template=tpl, tokenize=False, add_generation_prompt=True)
            for o in os_:
                r = dapo.compute_score(o, g)
                inputs.append(p), outputs.append(o), golds.append(g), scores.append(float(r["score"]))
                for k, v in r.items():
                    extra.setdefault(k, []).append(v)
        if name == "exp-b":  # its first row identical to exp-a's: same prompt text and answer
            first = json.loads((Path(out) / "exp-a" / "1.jsonl").read_text().splitlines()[0])
            inputs[0], outputs[0], scores[0] = first["input"], first["output"], first["score"]
            for k in extra:
                extra[k][0] = first[k]
        write(inputs, outputs, golds, scores, extra, str(Path(out) / name), 1)
    (Path(out) / "expected.json").write_text(json.dumps({
        "verl": version("verl"),
        "turns": {"exp-a": [[[m["role"], m["content"]] for m in c] for c in convs],
                  "exp-b": [[[m["role"], m["content"]] for m in c] for c in convs]}}, indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/verl_jobs")
