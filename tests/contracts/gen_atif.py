"""Write the ATIF contract fixture, field by field from the published schema (Harbor RFC 0001,
``docs/rfcs/0001-trajectory-format.md`` in laude-institute/harbor, v1.4: root, AgentSchema,
StepObject, ToolCallSchema, ObservationSchema, MetricsSchema with ``prompt_token_ids`` (v1.4) and
``completion_token_ids`` (v1.3), FinalMetricsSchema). Harbor itself (its Pydantic models) does not
install here, so this is the schema, not its writer. Run (no dependencies):

    python tests/contracts/gen_atif.py tests/contracts/fixtures/atif

A four-step agent run: system prompt, user task, an agent step with two tool calls and their
observation, a final agent answer; both agent steps carry token ids and log-probs, the second
prompt extending the first (history included, as v1.4 says).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SYS, USER = [1, 10, 11, 2], [1, 12, 13, 14, 2]
GEN1 = [20, 21, 22]
TOOL = [1, 30, 31, 2]
GEN2 = [40, 41]


def trajectory() -> dict:
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "sess-0001",
        "agent": {"name": "demo-agent", "version": "1.0.0", "model_name": "tiny-policy@step-7", "extra": {"temp": 1.0}},
        "notes": "contract fixture",
        "final_metrics": {"total_prompt_tokens": 25, "total_completion_tokens": 5, "total_cached_tokens": 0,
                          "total_cost_usd": 0.0, "total_steps": 4, "extra": {}},
        "extra": {"task_id": "add-2-3"},
        "steps": [
            {"step_id": 1, "timestamp": "2026-12-01T10:00:00Z", "source": "system", "message": "Use tools."},
            {"step_id": 2, "timestamp": "2026-12-01T10:00:01Z", "source": "user", "message": "What is 2 + 3?"},
            {"step_id": 3, "timestamp": "2026-12-01T10:00:02Z", "source": "agent", "model_name": "tiny-policy@step-7",
             "reasoning_effort": "low", "message": "Let me add.", "reasoning_content": "Two numbers: use add.",
             "tool_calls": [{"tool_call_id": "call_1", "function_name": "add", "arguments": {"a": 2, "b": 3}},
                            {"tool_call_id": "call_2", "function_name": "noop", "arguments": {}}],
             "observation": {"results": [{"source_call_id": "call_1", "content": "5"},
                                         {"source_call_id": "call_2", "content": "ok"}]},
             "metrics": {"prompt_tokens": len(SYS + USER), "completion_tokens": len(GEN1), "cached_tokens": 0,
                         "cost_usd": 0.0, "prompt_token_ids": SYS + USER, "completion_token_ids": GEN1,
                         "logprobs": [-0.5, -0.25, -0.125], "extra": {"reasoning_tokens": 0}}},
            {"step_id": 4, "timestamp": "2026-12-01T10:00:03Z", "source": "agent", "message": "The answer is 5.",
             "metrics": {"prompt_tokens": len(SYS + USER + GEN1 + TOOL), "completion_tokens": len(GEN2),
                         "prompt_token_ids": SYS + USER + GEN1 + TOOL, "completion_token_ids": GEN2,
                         "logprobs": [-1.0, -0.75]}},
        ],
    }


def main(out: str) -> None:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "trajectory.json").write_text(json.dumps(trajectory(), indent=1) + "\n")
    print(sorted(str(p) for p in d.iterdir()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/atif")
