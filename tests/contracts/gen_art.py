"""Write the OpenPipe ART contract fixture with ART's own writer: ``write_trajectory_groups_parquet``
(``art/utils/trajectory_logging.py``) on ``Trajectory`` / ``TrajectoryGroup`` objects
(``art/trajectories.py``), openpipe-art 0.5.18 (PyPI wheel), to the path ``Model.log`` gives it
(``art/model.py``): ``{output_dir}/trajectories/{split}/{step:04d}.parquet``.

The wheel's package ``__init__`` and its dependencies (litellm, weave, polars, ...) are not installed
here: point ``ART_SRC`` at the unpacked wheel (the folder holding ``art/``); this script loads
``art/types.py``, ``art/trajectories.py`` and ``art/utils/trajectory_logging.py`` unchanged under an
empty ``art`` package, with a stand-in for the one litellm name the writer imports (``Choices``,
used only for LiteLLM choice objects, which the fixture does not hold). Needs pydantic, openai,
pyarrow. Run:

    ART_SRC=/path/to/unpacked-wheel python tests/contracts/gen_art.py tests/contracts/fixtures/art
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path

from openai.types.chat.chat_completion import Choice


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_writer(src: Path) -> tuple[type, type, object]:
    for pkg, where in (("art", src / "art"), ("art.utils", src / "art" / "utils")):
        m = types.ModuleType(pkg)
        m.__path__ = [str(where)]
        sys.modules[pkg] = m
    for name in ("litellm", "litellm.types", "litellm.types.utils"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["litellm.types.utils"].Choices = type("Choices", (), {})  # stand-in, never instantiated
    _load("art.types", src / "art" / "types.py")
    tr = _load("art.trajectories", src / "art" / "trajectories.py")
    log = _load("art.utils.trajectory_logging", src / "art" / "utils" / "trajectory_logging.py")
    return tr.Trajectory, tr.TrajectoryGroup, log.write_trajectory_groups_parquet


def choice(text: str, tool_calls: list | None = None, finish: str = "stop") -> Choice:
    msg = {"role": "assistant", "content": text}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return Choice.model_validate({"index": 0, "finish_reason": "tool_calls" if tool_calls else finish,
                                  "message": msg, "logprobs": None})


def main(out: str) -> None:
    Trajectory, TrajectoryGroup, write = load_writer(Path(os.environ["ART_SRC"]))
    root = Path(out)
    shutil.rmtree(root, ignore_errors=True)
    sys_msg = {"role": "system", "content": "You are a careful calculator."}
    q = {"role": "user", "content": "What is 2+2?"}
    call = [{"id": "call-1", "type": "function", "function": {"name": "calc", "arguments": "{\"expr\": \"2+2\"}"}}]
    g1 = TrajectoryGroup([
        Trajectory(messages_and_choices=[sys_msg, q, choice("4")], reward=1.0, metrics={"correct": True, "turns": 1},
                   metadata={"task_id": "sum-1", "difficulty": 1}, logs=["scored 1.0"]),
        Trajectory(messages_and_choices=[sys_msg, q, choice("", call),
                                         {"role": "tool", "tool_call_id": "call-1", "content": "4"}, choice("It is 4.")],
                   reward=0.5, metrics={"correct": True, "turns": 2}, tools=[{"type": "function", "function": {
                       "name": "calc", "parameters": {"type": "object"}}}]),
        Trajectory(messages_and_choices=[sys_msg, q, choice("5", finish="length")], reward=-1.0, metrics={"correct": False}),
    ], metadata={"task_id": "sum-1"}, metrics={"pass_rate": 0.67}, logs=["group of 3"])
    g2 = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "Say hi."}, choice("hi")], reward=0.0)])
    d = root / "trajectories" / "train"
    d.mkdir(parents=True)
    write([g1, g2], d / "0003.parquet")
    v = root / "trajectories" / "val"
    v.mkdir(parents=True)
    write([TrajectoryGroup([Trajectory(messages_and_choices=[q, choice("4")], reward=1.0)])], v / "0003.parquet")


if __name__ == "__main__":
    main(sys.argv[1])
