"""Write the NeMo Gym token-capture contract fixture with Gym's own capture code
(NVIDIA-NeMo/Gym @ 07d6b0d07b22fcf530b4c211dae2ee23100428e4, ``nemo_gym/token_id_capture/``):
``sink.capture_tokens`` builds each ``TokenEntry`` (``records.py``) from a served response and
``store.TokenCaptureStore`` writes it, one ``<rollout_id>.tokens.jsonl`` per rollout (one line per
model call) beside its ``.tokens.state.json``, ``.tokens.lock``, ``.tokens.intents`` and, for a
rollout that lost a call, ``.tokens.incomplete``.

The ``token_id_capture`` package needs only pydantic and orjson, but ``nemo_gym/__init__.py`` pulls
Gym's server stack, so point ``GYM_SRC`` at a folder holding that package under an empty
``nemo_gym/__init__.py`` (the writer's files unchanged). Run:

    GYM_SRC=/path/with/nemo_gym python tests/contracts/gen_nemo_gym.py tests/contracts/fixtures/nemo_gym
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.environ["GYM_SRC"])

from nemo_gym.token_id_capture.sink import (  # noqa: E402
    CaptureContext,
    capture_tokens,
    register_call_intent,
    reset_token_sink,
    set_token_sink,
)
from nemo_gym.token_id_capture.store import TokenCaptureStore  # noqa: E402


def responses_payload(prompt: list[int], gen: list[int], lps: list[float], text: str) -> dict:
    """A Responses API reply with the token fields on its message item (as Gym's model server sends)."""
    return {"id": "resp-1", "model": "policy", "object": "response", "output": [
        {"type": "reasoning", "id": "rs-1", "summary": [{"type": "summary_text", "text": "add them"}]},
        {"type": "message", "id": "msg-1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}],
         "prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": lps}]}


def tool_call_payload(prompt: list[int], gen: list[int], lps: list[float]) -> dict:
    return {"id": "resp-2", "model": "policy", "output": [
        {"type": "function_call", "id": "fc-1", "call_id": "call-1", "name": "calculator",
         "arguments": "{\"expr\": \"2+2\"}", "status": "completed",
         "prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": lps}]}


def chat_payload(prompt: list[int], gen: list[int], lps: list[float], text: str) -> dict:
    return {"id": "chatcmpl-1", "model": "policy", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": text, "prompt_token_ids": prompt, "generation_token_ids": gen,
            "generation_log_probs": lps}}]}


async def call(store: TokenCaptureStore, rollout: str, call_id: str, payload: dict | None) -> None:
    """One captured model call: the intent first, then the entry (``None``: the call is lost)."""
    tok = set_token_sink(CaptureContext(rollout_id=rollout, model_call_id=call_id, token_sink=store))
    try:
        await register_call_intent()
        if payload is not None:
            await capture_tokens(payload)
    finally:
        reset_token_sink(tok)


async def main(out: str) -> None:
    d = Path(out)
    shutil.rmtree(d, ignore_errors=True)
    store = TokenCaptureStore(d)
    p = [1, 10, 11, 12, 2]
    # rollout-a: a tool call, then the answer on the extended prompt (an append-only agent loop)
    await call(store, "rollout-a", "call-a1", tool_call_payload(p, [30, 31, 2], [-0.5, -0.25, -0.125]))
    p2 = p + [30, 31, 2] + [40, 41]
    await call(store, "rollout-a", "call-a2", responses_payload(p2, [50, 51, 52, 2], [-1.0, -0.75, -0.0625, -0.001], "4"))
    # rollout-b: the same prompt, a chat-completions reply (a second sample of that prompt)
    await call(store, "rollout-b", "call-b1", chat_payload(p, [60, 2], [-2.0, -0.5], "four"))
    # rollout-c: one call captured, one response without token ids (Gym marks the rollout incomplete)
    await call(store, "rollout-c", "call-c1", chat_payload([1, 70, 2], [71, 2], [-0.3, -0.2], "x"))
    await call(store, "rollout-c", "call-c2", {"id": "r", "model": "policy", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "no ids"}]}]})
    # rollout-d: a call dispatched (its intent recorded) whose entry never arrived
    await call(store, "rollout-d", "call-d1", chat_payload([1, 80, 2], [81, 2], [-0.1, -0.05], "y"))
    await call(store, "rollout-d", "call-d2", None)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
