"""Generate the verl contract fixture with verl's own dump writer and scorers (not run in CI).

Framework: verl 0.9.1 (PyPI, installed ``--no-deps``: its trainer module pulls ray, tensordict and
CUDA-side packages). The writer ``RayPPOTrainer._write_generations`` is a static method; it is
taken from the installed ``verl/trainer/ppo/ray_trainer.py`` by name (``ast``) and run as is, so the
module's GPU-side imports are not needed. Rewards come from verl's own scorers, loaded by file:
``verl/utils/reward_score/math_dapo.py`` (returns ``{"score", "acc", "pred"}``: the ``dapo`` reward
manager path) and ``gsm8k.py`` (returns a float: the ``naive`` manager then sets ``acc = score``).
``reward_extra_infos_dict`` is built as those managers build it. Run:

    PYTHONPATH=src /tmp/fixvenv/bin/python tests/contracts/gen_verl.py tests/contracts/fixtures/verl
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
from pathlib import Path


def _verl_file(rel: str) -> Path:
    spec = importlib.util.find_spec("verl")
    return Path(spec.submodule_search_locations[0]) / rel


def _load(rel: str):
    spec = importlib.util.spec_from_file_location(rel.replace("/", "_"), _verl_file(rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_generations():
    src = _verl_file("trainer/ppo/ray_trainer.py").read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == "_write_generations":
            node.decorator_list = []
            ns = {"os": os, "json": json}
            exec(compile(ast.Module([node], []), "ray_trainer._write_generations", "exec"), ns)  # noqa: S102
            return ns["_write_generations"]
    raise RuntimeError("_write_generations not found")


def main(out: str) -> None:
    from importlib.metadata import version

    write = _write_generations()
    dapo, gsm8k = _load("utils/reward_score/math_dapo.py"), _load("utils/reward_score/gsm8k.py")
    prompts = ["user\nWhat is 2 + 3? Put the answer in \\boxed{}.\nassistant\n",
               "user\nWhat is 6 * 7? Put the answer in \\boxed{}.\nassistant\n"]
    outs = [["So it is \\boxed{5}.", "Maybe \\boxed{6}."], ["Answer: \\boxed{42}", "Answer: \\boxed{41}"]]
    gts = ["5", "42"]
    # step 1: the dapo reward manager (compute_score returns a dict: score, acc, pred)
    inputs, outputs, golds, scores, extra = [], [], [], [], {}
    for p, os_, g in zip(prompts, outs, gts, strict=True):
        for o in os_:
            r = dapo.compute_score(o, g)
            inputs.append(p), outputs.append(o), golds.append(g), scores.append(float(r["score"]))
            for k, v in r.items():
                extra.setdefault(k, []).append(v)
    extra["request_id"] = [f"req-{i}" for i in range(len(inputs))]
    write(inputs, outputs, golds, scores, extra, out, 1)
    # step 2: the naive reward manager over gsm8k's scorer (a float: acc = score)
    outs2 = [["#### 5", "#### 7"], ["#### 42", "no idea"]]
    inputs, outputs, golds, scores, extra = [], [], [], [], {"acc": []}
    for p, os_, g in zip(prompts, outs2, gts, strict=True):
        for o in os_:
            s = float(gsm8k.compute_score(o, g))
            inputs.append(p), outputs.append(o), golds.append(g), scores.append(s)
            extra["acc"].append(s)
    write(inputs, outputs, golds, scores, extra, out, 2)
    (Path(out) / "expected.json").write_text(json.dumps({"verl": version("verl")}))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/verl")
