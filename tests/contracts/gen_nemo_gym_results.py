"""Write the NeMo Gym job-folder fixture: the token captures of ``fixtures/nemo_gym`` (written by Gym's
own capture code, tests/contracts/gen_nemo_gym.py) beside the files Gym's rollout collection writes
(NVIDIA-NeMo/Gym @ 07d6b0d07b22fcf530b4c211dae2ee23100428e4, ``nemo_gym/rollout_collection.py``):

* ``rollouts.jsonl`` (``output_jsonl_fpath``): one line per finished trajectory, the agent's verify
  response (``BaseVerifyResponse``: ``responses_create_params``, ``response``, ``reward``) with the run
  row's ``_ng_task_index``, ``_ng_rollout_index``, ``agent_ref`` and, when the row had one,
  ``_ng_rollout_id`` copied onto it (``run_from_config``, the lines after ``row, result = await future``);
* ``rollouts_failures.jsonl`` (``failures_path_for``): a failed attempt, with ``_ng_failure_class``;
* ``rollouts_materialized_inputs.jsonl``: the dispatched rows.

Running Gym's collection needs its server stack (resources server, agent, model server), so these
three files are written here field by field from those lines, with Gym's own key names; the captures
are Gym's. Run: ``python tests/contracts/gen_nemo_gym_results.py tests/contracts/fixtures/nemo_gym_job``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent / "fixtures" / "nemo_gym"
AGENT = {"type": "responses_api_agents", "name": "calc_agent"}


def _row(task: int, rollout: int, rid: str) -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "_ng_rollout_id": rid, "agent_ref": AGENT,
            "responses_create_params": {"input": [{"role": "user", "content": f"task {task}"}]}}


def main(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(SRC, out / "captures")
    rows = [_row(0, 0, "rollout-a"), _row(0, 1, "rollout-b"), _row(1, 0, "rollout-c"), _row(2, 0, "rollout-d")]
    rewards = {"rollout-a": 1.0, "rollout-b": 0.0, "rollout-c": 0.5}  # rollout-d's attempt failed
    with open(out / "rollouts_materialized_inputs.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    with open(out / "rollouts.jsonl", "w") as f:
        for r in rows[:3]:
            result = {"responses_create_params": r["responses_create_params"],
                      "response": {"id": f"resp-{r['_ng_rollout_id']}", "output": []},
                      "reward": rewards[r["_ng_rollout_id"]]}
            for key in ("_ng_task_index", "_ng_rollout_index", "agent_ref", "_ng_rollout_id"):
                result[key] = r[key]
            f.write(json.dumps(result, sort_keys=True) + "\n")
    with open(out / "rollouts_failures.jsonl", "w") as f:
        fail = {key: rows[3][key] for key in ("_ng_task_index", "_ng_rollout_index", "agent_ref", "_ng_rollout_id")}
        f.write(json.dumps({**fail, "_ng_failure_class": "agent_error", "_ng_failure_terminal": False,
                            "reward": 0.0}, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
