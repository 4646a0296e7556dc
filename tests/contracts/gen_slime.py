"""Generate the slime contract fixture with slime's own writer (not run in CI).

Framework: slime (THUDM/slime) @ 624b824a -- not on PyPI (the PyPI name belongs to another
project), so its source tree is used: ``git archive 624b824a slime | tar -x -C /tmp/slime-src``.
The samples are ``slime.utils.types.Sample`` objects and the files are written by
``slime.observability.rollout_data_utils.save_debug_rollout_data`` (``{rollout_id}.pt`` for
training, ``eval_{rollout_id}.pt`` for evaluation, ``torch.save`` of ``Sample.to_dict()``). Run:

    SLIME_SRC=/tmp/slime-src /tmp/fixvenv/bin/python tests/contracts/gen_slime.py tests/contracts/fixtures/slime

(the fixvenv of gen_trl.py: torch 2.13.0). Writes ``10.pt``, ``eval_10.pt`` and ``expected.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: str) -> None:
    sys.path.insert(0, os.environ["SLIME_SRC"])
    from slime.observability.rollout_data_utils import save_debug_rollout_data
    from slime.utils.types import Sample

    def sample(gi, idx, prompt, resp, reward, status, mask=None, versions=("9", "10"), remove=False, label="5"):
        s = Sample(group_index=gi, index=idx, prompt=prompt, label=label)
        s.tokens = [1, 20 + gi, 21, 2] + resp
        s.response = " ".join(str(t) for t in resp)
        s.response_length = len(resp)
        s.loss_mask = mask if mask is not None else [1] * len(resp)
        s.rollout_log_probs = [-0.125 * (k + 1) for k in range(len(resp))]
        s.weight_versions = list(versions)
        s.reward = reward
        s.status = status
        s.remove_sample = remove
        s.metadata = {"src": "gen_slime"}
        return s

    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    train = [
        sample(0, 0, chat, [100, 101, 102], {"score": 1.0, "acc": True, "format": 0.5}, Sample.Status.COMPLETED),
        # tool output inside the response (loss_mask 0), truncated, removed by a filter
        sample(0, 1, chat, [103, 104, 105, 106, 107], {"score": -1.0, "acc": False, "format": 0.0},
               Sample.Status.TRUNCATED, mask=[1, 1, 0, 0, 1], remove=True),
        sample(1, 2, "What is 4 + 4?", [110, 111], {"score": 1.0, "acc": True, "format": 1.0},
               Sample.Status.COMPLETED, versions=("10",), label="8"),
        sample(1, 3, "What is 4 + 4?", [112, 113], {"score": 0.0, "acc": False, "format": 1.0},
               Sample.Status.ABORTED, versions=("10",), label="8"),
    ]
    save_debug_rollout_data(str(Path(out) / "{rollout_id}.pt"), train, rollout_id=10, evaluation=False)
    ev = {"aime": {"samples": [sample(0, 0, chat, [120, 121], {"score": 1.0, "acc": True, "format": 1.0},
                                      Sample.Status.COMPLETED, versions=("10",))]}}
    save_debug_rollout_data(str(Path(out) / "{rollout_id}.pt"), ev, rollout_id=10, evaluation=True)
    (Path(out) / "expected.json").write_text(json.dumps({
        "slime": "624b824a", "reward_key": "score",
        "rewards": [1.0, -1.0, 1.0, 0.0], "finish": ["stop", "length", "stop", "abort"],
        "policy_version": ["v9-10", "v9-10", "v10", "v10"], "remove_sample": [False, True, False, False],
    }, indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/slime")
