"""Write the OpenPipe ART 0.5.23 contract fixture with ART's own writer (not run in CI).

Framework: openpipe-art 0.5.23 (PyPI wheel, unpacked; it needs Python >= 3.12 and openai, anthropic,
pydantic, pyarrow; litellm is replaced by a stand-in for the one class the writer tests items
against, ``Choices``, which the fixture does not hold). ``art/__init__`` pulls the training stack, so the script puts empty ``art`` and
``art.utils`` packages in front and imports ``art.trajectories``, ``art.openai`` and
``art.utils.trajectory_logging`` from the wheel unchanged; ``write_trajectory_groups_parquet``
(format version 2: ``trajectory_index``, ``group_json``, ``trajectory_json`` beside the v1 columns)
writes ``{output_dir}/trajectories/train/0005.parquet``, the path ``Model.log`` gives it.

Groups: (0) two trajectories with ``initial_policy_version`` / ``final_policy_version`` (one spans
an update: 4 → 5) and choices that finished ``stop`` and ``length``; (1) a group whose every
rollout raised: ``TrajectoryGroup([RuntimeError, RuntimeError])`` keeps no trajectory, and the
writer writes its one sentinel row (``trajectory_index`` null); (2) a trajectory recorded as a
chat-completions exchange (``exchanges.chat_completions``), for which the writer leaves the
``messages`` column null; (3) a two-turn exchange trajectory with exact token ids and log-probs in
its responses (vLLM's ``prompt_token_ids`` / ``token_ids`` and ``token_id:N`` log-prob tokens). Run:

    ART_SRC=/tmp/wheels/x/openpipe_art /tmp/venv-art/bin/python tests/contracts/gen_art_0523.py \\
        tests/contracts/fixtures/art_0523
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
from datetime import UTC, datetime
from pathlib import Path


def load(src: Path):
    for pkg, where in (("art", src / "art"), ("art.utils", src / "art" / "utils")):
        m = types.ModuleType(pkg)
        m.__path__ = [str(where)]
        sys.modules[pkg] = m
    for name in ("litellm", "litellm.types", "litellm.types.utils"):  # the writer asks litellm only
        sys.modules[name] = types.ModuleType(name)  # whether an item is a LiteLLM Choices: a stand-in
    sys.modules["litellm.types.utils"].Choices = type("Choices", (), {})  # class, never instantiated
    import art.trajectories as tr
    import art.utils.trajectory_logging as log

    return tr, log.write_trajectory_groups_parquet


def main(out: str) -> None:
    from openai.types.chat.chat_completion import ChatCompletion, Choice

    tr, write = load(Path(os.environ.get("ART_SRC", "/tmp/wheels/x/openpipe_art")))
    root = Path(out)
    shutil.rmtree(root, ignore_errors=True)

    def choice(text: str, finish: str) -> Choice:
        return Choice.model_validate({"index": 0, "finish_reason": finish, "logprobs": None,
                                      "message": {"role": "assistant", "content": text}})

    q = {"role": "user", "content": "What is 2+2?"}
    g0 = tr.TrajectoryGroup([
        tr.Trajectory(messages_and_choices=[q, choice("4", "stop")], reward=1.0,
                      initial_policy_version=4, final_policy_version=4),
        tr.Trajectory(messages_and_choices=[q, choice("It is", "length")], reward=0.0,
                      initial_policy_version=4, final_policy_version=5),
    ], metadata={"task_id": "sum-1"})
    g1 = tr.TrajectoryGroup([RuntimeError("env crashed"), RuntimeError("env crashed again")],
                            metadata={"task_id": "sum-2"})
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    resp = ChatCompletion.model_validate({
        "id": "c-1", "object": "chat.completion", "created": 0, "model": "tiny",
        "choices": [{"index": 0, "finish_reason": "length", "logprobs": None,
                     "message": {"role": "assistant", "content": "Hel"}}]})
    ex = tr.ChatCompletionsExchange(start_time=t0, end_time=t0, response=resp,
                                    request={"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}]})
    g2 = tr.TrajectoryGroup([tr.Trajectory(exchanges=tr.TrajectoryExchanges(chat_completions=[ex]), reward=0.25,
                                           initial_policy_version=5, final_policy_version=5)])
    # (3) a two-turn chat trajectory served by vLLM with exact ids: the responses carry
    # ``prompt_token_ids`` and ``choices[0].token_ids`` (vLLM's return_token_ids) and per-token
    # log-probs whose tokens read ``token_id:N`` (return_tokens_as_token_ids), as ART's tokenizer
    # (``art/trajectories/_tokenize.py`` ``_chat_choice_tokens``) reads them
    def exact(rid: str, prompt: list[int], out: list[int], lps: list[float], text: str, finish: str):
        return ChatCompletion.model_validate({
            "id": rid, "object": "chat.completion", "created": 0, "model": "tiny", "prompt_token_ids": prompt,
            "choices": [{"index": 0, "finish_reason": finish, "token_ids": out,
                         "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None,
                                                   "top_logprobs": []} for t, lp in zip(out, lps, strict=True)]},
                         "message": {"role": "assistant", "content": text}}]})

    turn1 = [{"role": "user", "content": "Add 2 and 3."}]
    r1 = exact("c-2", [1, 10, 11, 2], [20, 21, 2], [-0.5, -0.25, -0.125], "5.", "stop")
    turn2 = [*turn1, {"role": "assistant", "content": "5."}, {"role": "user", "content": "Times 2?"}]
    r2 = exact("c-3", [1, 10, 11, 2, 20, 21, 2, 1, 12, 2], [30, 2], [-0.75, -0.5], "10.", "stop")
    ex1 = tr.ChatCompletionsExchange(start_time=t0, end_time=t0, response=r1, request={"model": "tiny", "messages": turn1})
    ex2 = tr.ChatCompletionsExchange(start_time=t0, end_time=t0, response=r2, request={"model": "tiny", "messages": turn2})
    g3 = tr.TrajectoryGroup([tr.Trajectory(exchanges=tr.TrajectoryExchanges(chat_completions=[ex1, ex2]), reward=1.0,
                                           initial_policy_version=5, final_policy_version=5)])
    d = root / "trajectories" / "train"
    d.mkdir(parents=True)
    write([g0, g1, g2, g3], d / "0005.parquet")
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("openpipe-art")
    except PackageNotFoundError:
        v = "0.5.23 (unpacked wheel)"
    (root / "expected.json").write_text(json.dumps({
        "art": v, "rows": 5, "rollouts": 4, "sentinel_groups": 1,
        "finish": ["stop", "length", "length", "stop"], "policy": ["step-4", "step-4..5", "step-5", "step-5"],
        "exact": {"token_ids": [1, 10, 11, 2, 20, 21, 2, 1, 12, 2, 30, 2], "token_role": [0] * 4 + [1] * 3 + [0] * 3 + [1] * 2,
                  "logprobs": [0.0] * 4 + [-0.5, -0.25, -0.125] + [0.0] * 3 + [-0.75, -0.5]},
        "exchange_messages": [["user", "Say hello."], ["assistant", "Hel"]]}, indent=1))
    print(sorted(str(p) for p in root.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/art_0523")
