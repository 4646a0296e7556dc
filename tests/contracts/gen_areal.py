"""Generate the AReaL contract fixtures with AReaL's own dump writer (not run in CI).

Frameworks: areal 1.0.4 (PyPI, installed ``--no-deps`` plus ``aiofiles colorlog``) and AReaL's
source at areal-project/AReaL @ cbff54d6 (``git archive cbff54d6 areal | tar -x -C /tmp/areal-src``),
whose writer adds ``version_rle`` and multi-turn ``segments`` and takes the head version over
generated tokens. Both call ``WorkflowExecutor._dump_trajectory`` itself (on a stand-in executor
that carries only the config, tokenizer and logger it reads); modules AReaL imports but this path
never calls (ray, hydra, flask, …) are stubbed. Run:

    PYTHONPATH=src /tmp/fixvenv/bin/python tests/contracts/gen_areal.py tests/contracts/fixtures/areal/v1.0.4
    AREAL_SRC=/tmp/areal-src PYTHONPATH=src /tmp/fixvenv/bin/python tests/contracts/gen_areal.py \
        tests/contracts/fixtures/areal/cbff54d6

Trajectories: prompt tokens carry version -1 (as AReaL's workflows set them); one sample spans
versions 2 and 3 (a partial rollout); one is multi-turn (a tool turn inside the completion, loss
mask 0); one batch is an evaluation rollout (``eval-rollout/``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import types
from pathlib import Path

from _stubs import StubFinder  # this folder is on sys.path when run as a script

_STUBBED = ["flask", "torchdata", "werkzeug", "lark", "uvloop", "hydra", "omegaconf", "ray", "numba", "einops", "swanlab", "tabulate", "tensorboardX", "wandb", "trackio"]


def main(out: str) -> None:
    if os.environ.get("AREAL_SRC"):
        sys.path.insert(0, os.environ["AREAL_SRC"])
    sys.meta_path.append(StubFinder(_STUBBED))
    import torch
    from areal.infra.workflow_executor import WorkflowExecutor

    from gfcr.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    root = Path(out).resolve()
    ex = types.SimpleNamespace(
        config=types.SimpleNamespace(fileroot=str(root), experiment_name="exp", trial_name="t1"),
        logger=logging.getLogger("areal-gen"),
        inference_engine=types.SimpleNamespace(get_version=lambda: 0),
        _get_tokenizer=lambda: tok,
    )
    ex._get_dump_dir = types.MethodType(WorkflowExecutor._get_dump_dir, ex)
    for name in ("_compute_output_versions", "_split_trajectory_for_dump"):
        if hasattr(WorkflowExecutor, name):
            setattr(ex, name, getattr(WorkflowExecutor, name))

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def traj(samples):
        """samples: list of (segments [(text, is_generated, version)], reward)."""
        rows, masks, vers, rewards = [], [], [], []
        for segs, reward in samples:
            r, m, v = [], [], []
            for text, gen, ver in segs:
                t = ids(text)
                r += t
                m += [1 if gen else 0] * len(t)
                v += [ver if gen else -1] * len(t)
            rows.append(r), masks.append(m), vers.append(v), rewards.append(reward)
        width = max(len(r) for r in rows)

        def pad(x, val):
            return torch.tensor([a + [val] * (width - len(a)) for a in x])

        return {"input_ids": pad(rows, tok.pad_token_id), "loss_mask": pad(masks, 0), "versions": pad(vers, -1),
                "attention_mask": pad([[1] * len(r) for r in rows], 0), "rewards": torch.tensor(rewards)}

    def prompt(q):
        return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"

    q1, q2 = prompt("What is 2 + 3?"), prompt("What is 6 * 7?")
    batch1 = traj([
        ([(q1, False, -1), ("The answer is 5.<|im_end|>", True, 3)], 1.0),
        ([(q1, False, -1), ("I think it ", True, 2), ("is 6.<|im_end|>", True, 3)], 0.0),  # spans v2 and v3
    ])
    batch2 = traj([
        ([(q2, False, -1), ("<tool>calculator: 6 * 7</tool><|im_end|>", True, 3),
          ("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", False, -1),
          ("So the answer is 42.<|im_end|>", True, 3)], 1.0),
    ])
    evalb = traj([([(q1, False, -1), ("5<|im_end|>", True, 3)], 1.0)])

    async def run():
        for t, task_id, is_eval in ((batch1, 7, False), (batch2, 8, False), (evalb, 9, True)):
            ok, why = await WorkflowExecutor._dump_trajectory(ex, t, task_id, is_eval)
            assert ok, why

    asyncio.run(run())
    import areal

    (root / "expected.json").write_text(json.dumps({"areal": getattr(areal, "__version__", "?"),
                                                   "source": os.environ.get("AREAL_SRC") and "cbff54d6"}))
    print(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/areal")
