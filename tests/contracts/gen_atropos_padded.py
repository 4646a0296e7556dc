"""Write the Atropos padded-log-prob fixture with ManagedServer's own sequence builder (not run in CI).

Framework: atroposlib 0.4.0 (PyPI wheel, unpacked). ``ManagedServer._create_sequence_node`` and its
``SequenceNode`` model are taken from ``atroposlib/envs/server_handling/managed_server.py`` by name
(``ast``) and run as they are (the method reads nothing from ``self``), so the server stack it lives
in is not needed. When the inference server returns fewer log-probs than tokens, that function pads
the generated positions with ``1.0`` (the value it also puts on prompt positions). The nodes become
one ``ScoredDataGroup`` line (``tokens``, ``masks`` = the nodes' ``masked_tokens``,
``inference_logprobs`` = their ``logprobs``, ``scores``, ``overrides`` with the finish reason), as
``BaseEnv`` writes it with ``jsonlines`` (``json.dumps`` of the group dict). Run:

    ATROPOS_SRC=/tmp/wheels/x/atroposlib PYTHONPATH=src python tests/contracts/gen_atropos_padded.py \\
        tests/contracts/fixtures/atropos_padded
"""

from __future__ import annotations

import ast
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any


def _builder(src: Path):
    tree = ast.parse((src / "atroposlib/envs/server_handling/managed_server.py").read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SequenceNode"]
    for c in tree.body:
        if isinstance(c, ast.ClassDef) and c.name == "ManagedServer":
            nodes += [f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "_create_sequence_node"]
    from pydantic import BaseModel

    # the names managed_server.py imports from typing, for the code taken from it
    ns: dict[str, Any] = {"BaseModel": BaseModel, **{k: getattr(typing, k) for k in ("List", "Optional", "Dict", "Any")}}
    exec(compile(ast.Module(nodes, []), "managed_server", "exec", dont_inherit=True), ns)  # noqa: S102
    return ns["_create_sequence_node"]


def main(out: str) -> None:
    make = _builder(Path(os.environ.get("ATROPOS_SRC", "/tmp/wheels/x/atroposlib")))
    p = [1, 10, 11, 2]
    full = make(None, "2+3?", None, p, [20, 21, 2], [-0.5, -0.25, -0.125], "5", "stop")
    short = make(None, "2+3?", None, p, [22, 23, 2], [-1.0], "6 or 7", "length")  # 2 log-probs missing: padded
    group = {"tokens": [full.tokens, short.tokens], "masks": [full.masked_tokens, short.masked_tokens],
             "scores": [1.0, -1.0], "advantages": None, "ref_logprobs": None, "messages": None,
             "generation_params": {"temperature": 1.0},
             "inference_logprobs": [full.logprobs, short.logprobs], "group_overrides": None,
             "overrides": [full.metadata, short.metadata], "images": None}
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "groups.jsonl").write_text(json.dumps(group) + "\n")
    (d / "expected.json").write_text(json.dumps({"atroposlib": "0.4.0", "logprobs": [
        [0.0] * 4 + [-0.5, -0.25, -0.125], [0.0] * 4 + [-1.0, 0.0, 0.0]], "missing": [0, 2]}, indent=1))
    print(sorted(str(x) for x in d.rglob("*") if x.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/atropos_padded")
