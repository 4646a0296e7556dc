"""Write a Harbor job folder with Harbor's own ATIF models (not run in CI).

Framework: harbor 0.26.0 (PyPI wheel, unpacked; needs pydantic). Its package ``__init__`` pulls the
whole agent/runtime stack, so this script loads ``harbor/models/trajectories/*.py`` and
``harbor/utils/trajectory_utils.py`` (``format_trajectory_json``, the function Harbor's agents write
``trajectory.json`` with) unchanged under empty ``harbor`` packages. Every trajectory is built as a
``Trajectory`` model (so Harbor's own validators run) and written with ``to_json_dict()`` +
``format_trajectory_json``, to the paths of ``harbor/models/trial/paths.py``:
``{job}/{trial}/agent/trajectory.json`` (a continuation: ``trajectory.cont-1.json``, as
``Terminus2._dump_trajectory_with_continuation_index`` names it), beside the other files a job
holds: ``{job}/config.json``, ``{job}/result.json``, ``{trial}/config.json``, ``{trial}/result.json``,
``{trial}/verifier/reward.json`` or ``reward.txt`` (``Verifier``), ``{trial}/artifacts/manifest.json``.
The config and result files are small stand-ins (their content is not a trajectory either way).

Trials: ``t1`` ATIF-v1.8 with token ids on both agent steps; ``t2`` a continued session (root +
``trajectory.cont-1.json``, one ``session_id``; the continuation's first steps copied context,
``is_copied_context``, without token ids; its new agent step with them); ``t3`` a root trajectory
with no ``session_id`` (optional since v1.7) and a v1.6 user message of content parts (text +
image). Run:

    HARBOR_SRC=/tmp/wheels/x/harbor python tests/contracts/gen_harbor_job.py tests/contracts/fixtures/harbor_job
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path


def _load_harbor(src: Path) -> tuple[types.ModuleType, types.ModuleType]:
    for pkg, where in (("harbor", src / "harbor"), ("harbor.models", src / "harbor" / "models"),
                       ("harbor.models.agent", src / "harbor" / "models" / "agent"),
                       ("harbor.utils", src / "harbor" / "utils")):
        m = types.ModuleType(pkg)
        m.__path__ = [str(where)]
        sys.modules[pkg] = m
    ctx = types.ModuleType("harbor.models.agent.context")  # trajectory_utils imports one name from it
    ctx.ModelUsage = object
    sys.modules["harbor.models.agent.context"] = ctx
    import harbor.models.trajectories as T

    spec = importlib.util.spec_from_file_location("harbor.utils.trajectory_utils",
                                                  src / "harbor" / "utils" / "trajectory_utils.py")
    U = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = U
    spec.loader.exec_module(U)
    return T, U


def main(out: str) -> None:
    T, U = _load_harbor(Path(os.environ.get("HARBOR_SRC", "/tmp/wheels/x/harbor")))
    job = Path(out)

    def write(path: Path, traj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(U.format_trajectory_json(traj.to_json_dict()))

    def side(trial: str, reward) -> None:
        d = job / trial
        (d / "verifier").mkdir(parents=True, exist_ok=True)
        if isinstance(reward, dict):
            (d / "verifier" / "reward.json").write_text(json.dumps(reward))
        else:
            (d / "verifier" / "reward.txt").write_text(str(reward))
        (d / "verifier" / "test-stdout.txt").write_text("1 passed\n")
        (d / "config.json").write_text(json.dumps({"task": {"path": "tasks/add"}, "agent": {"name": "terminus-2"}}))
        (d / "result.json").write_text(json.dumps({"trial_name": trial, "verifier_result": {"rewards": reward}}))
        (d / "artifacts").mkdir(exist_ok=True)
        (d / "artifacts" / "manifest.json").write_text(json.dumps({"files": []}))

    agent = T.Agent(name="terminus-2", version="2.0.0", model_name="tiny-policy")
    sys_step = T.Step(step_id=1, source="system", message="Solve the task.")
    user = T.Step(step_id=2, source="user", message="What is 2 + 3?")
    m1 = T.Metrics(prompt_tokens=5, completion_tokens=3, prompt_token_ids=[1, 10, 2, 1, 11],
                   completion_token_ids=[20, 21, 22], logprobs=[-0.5, -0.25, -0.125])
    a1 = T.Step(step_id=3, source="agent", message="Adding.", metrics=m1,
                tool_calls=[T.ToolCall(tool_call_id="c1", function_name="add", arguments={"a": 2, "b": 3})],
                observation=T.Observation(results=[T.ObservationResult(source_call_id="c1", content="5")]))
    m2 = T.Metrics(prompt_tokens=10, completion_tokens=2, prompt_token_ids=[1, 10, 2, 1, 11, 20, 21, 22, 30, 31],
                   completion_token_ids=[40, 41], logprobs=[-0.5, -0.5])
    a2 = T.Step(step_id=4, source="agent", message="It is 5.", metrics=m2)
    write(job / "t1" / "agent" / "trajectory.json",
          T.Trajectory(schema_version="ATIF-v1.8", session_id="sess-t1", agent=agent, steps=[sys_step, user, a1, a2]))
    side("t1", {"reward": 1.0})
    # t2: a continued session: the root segment, then trajectory.cont-1.json with copied context
    root = T.Trajectory(schema_version="ATIF-v1.8", session_id="sess-t2", agent=agent,
                        steps=[sys_step, user, a1.model_copy(update={"step_id": 3})],
                        continued_trajectory_ref="trajectory.cont-1.json")
    write(job / "t2" / "agent" / "trajectory.json", root)
    copied = [s.model_copy(update={"is_copied_context": True, "metrics": None}) for s in (sys_step, user)]
    summary = T.Step(step_id=3, source="user", message="Summary: you called add(2, 3) = 5.", is_copied_context=True)
    m3 = T.Metrics(prompt_tokens=8, completion_tokens=2, prompt_token_ids=[1, 10, 2, 1, 11, 2, 50, 51],
                   completion_token_ids=[60, 61], logprobs=[-0.75, -0.5])
    new = T.Step(step_id=4, source="agent", message="So: 5.", metrics=m3)
    cont = T.Trajectory(schema_version="ATIF-v1.8", session_id="sess-t2",
                        agent=agent.model_copy(update={"extra": {"continuation_index": 1}}),
                        steps=[*copied, summary, new])
    write(job / "t2" / "agent" / "trajectory.cont-1.json", cont)
    side("t2", 0.0)
    # t3: no session_id (optional since v1.7); a v1.6 content-part message (text + image)
    parts = T.Step(step_id=1, source="user", message=[
        T.ContentPart(type="text", text="What does the picture show?"),
        T.ContentPart(type="image", source=T.ImageSource(media_type="image/png", path="images/cat.png"))])
    ans = T.Step(step_id=2, source="agent", message="A cat.")
    write(job / "t3" / "agent" / "trajectory.json",
          T.Trajectory(schema_version="ATIF-v1.7", agent=agent, steps=[parts, ans]))
    side("t3", {"reward": 1.0, "style": 0.5})
    (job / "config.json").write_text(json.dumps({"job_name": "demo", "n_attempts": 1}))
    (job / "result.json").write_text(json.dumps({"n_trials": 3, "stats": {"mean_reward": 0.5}}))
    from importlib.metadata import PackageNotFoundError, version

    try:
        hv = version("harbor")
    except PackageNotFoundError:
        hv = "0.26.0 (unpacked wheel)"
    (job.parent / f"{job.name}.expected.json").write_text(json.dumps(
        {"harbor": hv, "trajectories": 4, "rollouts": 4, "rewards": {"t1": 1.0, "t2": 0.0, "t3": 1.0}}, indent=1))
    print(sorted(str(p) for p in job.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/harbor_job")
