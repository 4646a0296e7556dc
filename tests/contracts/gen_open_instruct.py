"""Generate the open-instruct contract fixture with open-instruct's own ``save_traces`` writer (not run in CI).

Framework: allenai/open-instruct @ e6c3044a (not on PyPI):
``git archive e6c3044a open_instruct/rl_utils.py open_instruct/data_types.py | tar -x -C /tmp/oi-src``.
``open_instruct.rl_utils.save_rollout_metadata`` and ``save_rollouts_to_disk`` (→ ``_save_rollouts``,
``RolloutRecord``) run as they are; ``data_types.GenerationResult`` / ``RequestInfo`` are the real
dataclasses; the package's logger, git and model helpers (imported by ``rl_utils`` but unused by the
writer except ``utils.get_git_commit``) are small stand-ins. Run:

    OI_SRC=/tmp/oi-src /tmp/fixvenv/bin/python tests/contracts/gen_open_instruct.py tests/contracts/fixtures/open_instruct
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(out: str) -> None:
    src = Path(os.environ["OI_SRC"]) / "open_instruct"
    pkg = types.ModuleType("open_instruct")
    pkg.__path__ = [str(src)]
    sys.modules["open_instruct"] = pkg
    pkg.logger_utils = types.SimpleNamespace(setup_logger=logging.getLogger)
    pkg.utils = types.SimpleNamespace(get_git_commit=lambda: "e6c3044a")
    pkg.model_utils = types.SimpleNamespace(Batch=object)
    for n in ("logger_utils", "utils", "model_utils"):
        sys.modules[f"open_instruct.{n}"] = getattr(pkg, n)
    dt = _load("open_instruct.data_types", src / "data_types.py")
    pkg.data_types = dt
    rl = _load("open_instruct.rl_utils", src / "rl_utils.py")

    import numpy as np

    rl.save_rollout_metadata(out, "grpo_demo", "tiny-model")
    # 2 prompts x 2 samples; sample 1 called a tool; sample 3 hit the length limit
    batch = types.SimpleNamespace(
        queries=[[1, 50, 51, 2], [1, 50, 51, 2], [1, 60, 61, 62, 2], [1, 60, 61, 62, 2]],
        scores=[10.0, 0.0, 10.0, 0.0], datasets=["gsm8k"] * 4, ground_truths=["5", "5", "42", "42"])
    info = dt.RequestInfo(num_calls=[0, 1, 0, 0], timeouts=[0, 0, 0, 0], tool_errors=["", "", "", ""],
                          tool_outputs=["", "5", "", ""], tool_runtimes=[0.0, 0.01, 0.0, 0.0],
                          tool_calleds=[False, True, False, False],
                          tool_call_stats=[[], [dt.ToolCallStats("python", True, 0.01)], [], []],
                          rollout_states=[{}, {}, {}, {}])
    responses = [[70, 71, 2], [72, 73, 74, 75, 2], [76, 2], [77, 78, 79]]
    result = dt.GenerationResult(
        responses=responses, finish_reasons=["stop", "stop", "stop", "length"],
        masks=[[1] * len(r) for r in responses], request_info=info, index=0, prompt_id=None,
        logprobs=[[-0.25 * (k + 1) for k in range(len(r))] for r in responses])
    rl.save_rollouts_to_disk(out, "grpo_demo", 7, batch, result, np.array([0.5, -0.5, 0.5, -0.5]), 2, 0)
    rl._rollout_executor.shutdown(wait=True)
    (Path(out) / "expected.json").write_text(json.dumps({"open_instruct": "e6c3044a"}))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/open_instruct")
