"""Generate the prime-rl / verifiers v1 contract fixture with both frameworks' own code (not run in CI).

Framework: verifiers 0.4.0 (PyPI) for the Episode/Trace/MessageNode records and their
``to_record()`` serializer; prime-rl @ 559b4477 (not on PyPI: its source tree, exported with
``git archive``) for ``FileMonitor.log_episodes`` (the writer of
``rollouts/step_N/{train,eval}/{all,effective}/traces.jsonl``) and ``assign_advantages`` /
``scalar_advantage`` (the orchestrator's credit assignment). Run on demand:

    python -m venv /tmp/fixvenv && /tmp/fixvenv/bin/pip install torch==2.13.0 verifiers==0.4.0 orjson msgspec
    git -C prime-rl archive 559b4477 src packages | tar -x -C /tmp/prime-rl-src
    PRIME_RL_SRC=/tmp/prime-rl-src /tmp/fixvenv/bin/python tests/contracts/gen_prime_rl.py tests/contracts/fixtures/prime_rl

prime-rl's modules import wandb and the Prime CLI at import time; those are stubbed (never
called). The episodes are stamped exactly as prime-rl's dispatcher does (``GroupInfo``,
``PolicySpan``, ``TrainWorkInfo``/``EvalWorkInfo``, ``TrainRunInfo``), logged to ``all/`` on arrival
(train episodes under the batch step, not the dispatch step), then credited and logged to
``effective/`` as ``ProcessedEpisodes.vf_episodes`` does. Writes ``expected.json`` with the values
the frameworks meant.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from _stubs import StubFinder  # this folder is on sys.path when run as a script


def main(out: str) -> None:
    src = Path(os.environ["PRIME_RL_SRC"])
    sys.path[:0] = [str(src / "src"), str(src / "packages" / "prime-rl-configs" / "src")]
    sys.meta_path.append(StubFinder(["wandb", "prime_cli", "wandb_workspaces", "wandb_gql"]))
    import verifiers
    import verifiers.v1 as vf
    from prime_rl.configs.monitors import FileMonitorConfig
    from prime_rl.monitors.file import FileMonitor
    from prime_rl.orchestrator.algo.routing import assign_advantages, scalar_advantage
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, ModelCall, Trace, TraceTask
    from verifiers.v1.types import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage

    def node(parent, msg, ids, mask=None, lps=None, sampled=False):
        mask = mask or [False] * len(ids)
        return MessageNode(parent=parent, message=msg, sampled=sampled, token_ids=ids, mask=mask,
                           logprobs=lps or [])

    def trace(task, nodes, calls, rewards, metrics=None, stop=None):
        t = Trace(task=task, agent=AgentInfo(config=AgentConfig()), nodes=nodes, calls=calls)
        for name, (score, weight) in rewards.items():
            t.record_reward(name, score, weight)
        t.record_metrics(metrics or {})
        t.stop(stop or "done")
        t.ok = True
        return t

    task1 = TraceTask(type="MathTask", data={"question": "What is 2 + 3?", "answer": "5"}, key="q-2+3")
    task2 = TraceTask(type="MathTask", data={"question": "What is 4 + 4?", "answer": "8"}, key="q-4+4")
    sys_msg = SystemMessage(content="Answer with a number.")
    # Episode A: one turn, right; scaffold tokens before the completion are not sampled
    a = trace(task1, [
        node(None, sys_msg, [1, 10, 11, 2]),
        node(0, UserMessage(content="What is 2 + 3?"), [1, 12, 13, 14, 2]),
        node(1, AssistantMessage(content="5"), [1, 15, 40, 41, 2], [False, False, True, True, True],
             [-0.5, -0.25, -0.125], sampled=True),
    ], [ModelCall(node=2, finish_reason="stop")], {"correct": (1.0, 1.0), "format": (0.5, 0.2)}, {"turns": 1.0})
    # Episode B: a tool call, the tool's answer, then a reply cut at the length limit
    b = trace(task1, [
        node(None, sys_msg, [1, 10, 11, 2]),
        node(0, UserMessage(content="What is 2 + 3?"), [1, 12, 13, 14, 2]),
        node(1, AssistantMessage(content="", tool_calls=[ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')]),
             [1, 15, 50, 51, 52, 2], [False, False, True, True, True, True], [-0.1, -0.2, -0.3, -0.4], sampled=True),
        node(2, ToolMessage(tool_call_id="c1", name="add", content="5"), [1, 16, 42, 2]),
        node(3, AssistantMessage(content="The answer is"), [1, 15, 60, 61], [False, False, True, True],
             [-0.6, -0.7], sampled=True),
    ], [ModelCall(node=2, finish_reason="tool_calls"), ModelCall(node=4, finish_reason="length")],
        {"correct": (0.0, 1.0), "format": (0.0, 0.2)}, {"turns": 2.0})
    # Episode C: a trace whose graph has two leaves (a compaction branch): two training samples
    c = trace(task2, [
        node(None, UserMessage(content="What is 4 + 4?"), [1, 12, 17, 17, 2]),
        node(0, AssistantMessage(content="8"), [1, 15, 43, 2], [False, False, True, True], [-0.3, -0.05], sampled=True),
        node(0, AssistantMessage(content="9"), [1, 15, 44, 2], [False, False, True, True], [-1.5, -0.05], sampled=True),
    ], [ModelCall(node=1, finish_reason="stop"), ModelCall(node=2, finish_reason="stop")],
        {"correct": (1.0, 1.0)}, {})
    d_fail = None  # Episode D: failed before producing any trace (only in all/)

    def episode(traces, group, step, policy, kind="train", ok=True):
        e = vf.Episode(task=traces[0].task if traces else task2, traces=traces, ok=ok)
        e.env.id, e.env.name = "math-env", "math"
        e.group = vf.GroupInfo(id=group)
        span = vf.PolicySpan(start=policy[0], end=policy[1]) if policy else None
        work = vf.EvalWorkInfo(step=step, policy=span) if kind == "eval" else vf.TrainWorkInfo(step=step, policy=span)
        e.record_run(vf.TrainRunInfo(id="run-xyz", name="demo", work=work))
        return e

    ea = episode([a], "g1", 3, (2, 3))
    eb = episode([b], "g1", 3, (3, 3))
    ec = episode([c], "g2", 3, (3, 3))
    d_fail = episode([], "g2", 3, (3, 3), ok=False)
    d_fail.errors.append(vf.Error(type="TimeoutError", message="sandbox timed out"))
    ev = episode([trace(task1, [
        node(None, UserMessage(content="What is 2 + 3?"), [1, 12, 13, 14, 2]),
        node(0, AssistantMessage(content="5"), [1, 15, 40, 2], [False, False, True, True], [-0.2, -0.1], sampled=True),
    ], [ModelCall(node=1, finish_reason="stop")], {"correct": (1.0, 1.0)})], "ev1", 3, (3, 3), kind="eval")

    async def run():
        fm = FileMonitor(FileMonitorConfig())
        await fm.init(output_dir=Path(out))
        batch_step = 4
        for e in (ea, eb, d_fail, ec):  # arrival order; train episodes go under the batch step
            await fm.log_episodes([e], step=batch_step, kind="train", subset="all")
        await fm.log_episodes([ev], step=3, kind="eval", subset="all")
        # group-relative credit, assigned as the orchestrator does, then the effective cohort
        groups = {"g1": [ea, eb], "g2": [ec]}
        for eps in groups.values():
            rewards = [t.reward for e in eps for t in e.traces]
            mean = sum(rewards) / len(rewards)
            for e in eps:
                for t in e.traces:
                    assign_advantages(t, t.reward - mean)
        effective = []
        for e in (ea, eb):  # ec's group has zero advantage: filtered (filter_zero_advantages)
            traces = [t.model_copy(update={"info": {**t.info, "advantage": scalar_advantage(t)}}) for t in e.traces]
            effective.append(e.model_copy(update={"traces": traces}))
        await fm.log_episodes(effective, step=batch_step, kind="train", subset="effective")
        await fm.log_episodes([ev], step=3, kind="eval", subset="effective")

    asyncio.run(run())
    (Path(out) / "metrics.jsonl").unlink(missing_ok=True)
    exp = {
        "verifiers": verifiers.__version__, "prime_rl": "559b4477",
        "a": {"reward": a.reward, "advantage": a.reward - (a.reward + b.reward) / 2, "finish": "stop"},
        "b": {"reward": b.reward, "advantage": b.reward - (a.reward + b.reward) / 2, "finish": "length"},
        "c": {"reward": c.reward, "branches": 2},
    }
    (Path(out) / "expected.json").write_text(json.dumps(exp, indent=1))
    print(sorted(str(p) for p in Path(out).rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/prime_rl")
