"""Every importer validates what it writes as docs/store.md promises (log-probs finite and <= 0, one
per token, equal lengths ...): a bad row is one line naming file, row and field, and nothing is
written. The inputs are the contract fixtures (written by the frameworks' own code) with one value
damaged."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, import_rollouts

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"
PRIME = FIX / "prime_rl" / "rollouts" / "step_4" / "train" / "effective" / "traces.jsonl"


def _prime_dump(tmp_path: Path, mutate) -> Path:
    """The prime-rl fixture's effective/ file with ``mutate`` applied to episode 1's sampled node."""
    root = tmp_path / "dump"
    dst = root / "rollouts" / "step_4" / "train" / "effective" / "traces.jsonl"
    dst.parent.mkdir(parents=True)
    lines = PRIME.read_text().splitlines()
    ep = json.loads(lines[0])
    mutate(ep["traces"][0]["nodes"][2])
    lines[0] = json.dumps(ep)  # json writes NaN as the bare token NaN, as Python writers do
    dst.write_text("\n".join(lines) + "\n")
    return root


def _refused(store, fmt, root, match, field, where="line 1"):
    before = store.count(), store.version
    with pytest.raises(ImportFormatError, match=match) as e:
        import_rollouts(store, fmt, [str(root)], run_id="x")
    msg = str(e.value)
    assert "\n" not in msg and where in msg and f"field '{field}'" in msg
    assert (store.count(), store.version) == before  # nothing written
    return msg


@pytest.mark.parametrize(("mutate", "match", "field"), [
    (lambda n: n["logprobs"].__setitem__(1, float("nan")), "must be finite", "logprobs[1]"),
    (lambda n: n["logprobs"].__setitem__(0, float("-inf")), "must be finite", "logprobs[0]"),
    (lambda n: n.__setitem__("logprobs", [0.0, 0.0, -0.5, float("nan"), -0.1]), "must be finite", "logprobs[1]"),
    (lambda n: n.__setitem__("logprobs", []), r"length 0 != 3", "logprobs"),
    (lambda n: n.__setitem__("logprobs", [-0.5]), r"length 1 != 3", "logprobs"),
    (lambda n: n["logprobs"].__setitem__(2, 0.5), "must be <= 0", "logprobs[2]"),
    (lambda n: n["logprobs"].__setitem__(2, None), "expected a number", "logprobs[2]"),
])
def test_prime_rl_bad_logprobs_refused(store, tmp_path, mutate, match, field):
    """A NaN log-prob was stored as 0.0 (probability 1) with exit 0; now one line, nothing written."""
    root = _prime_dump(tmp_path, mutate)
    msg = _refused(store, "prime-rl", root, match, field)
    assert "traces.jsonl" in msg and "nodes[2]" in msg


def test_prime_rl_refusal_leaves_an_existing_store_as_it_was(store, tmp_path):
    import_rollouts(store, "prime-rl", [str(FIX / "prime_rl")], run_id="x")
    root = _prime_dump(tmp_path, lambda n: n["logprobs"].__setitem__(1, float("nan")))
    _refused(store, "prime-rl", root, "must be finite", "logprobs[1]")


def test_open_instruct_nan_logprob_refused(store, tmp_path):
    src = FIX / "open_instruct"
    d = tmp_path / "oi"
    shutil.copytree(src, d)
    f = d / "grpo_demo_rollouts_000000.jsonl"
    lines = f.read_text().splitlines()
    row = json.loads(lines[2])
    row["logprobs"][1] = float("nan")
    lines[2] = json.dumps(row)
    f.write_text("\n".join(lines) + "\n")
    _refused(store, "open-instruct", d, "must be finite", "logprobs[1]", where="line 3")


def test_validation_names_the_row_not_only_the_record(store, tmp_path):
    """A check made on the finished record (here a finish reason outside the vocabulary, from gfcr's
    own JSONL) names the line it came from, once."""
    from gfcr.formats.export import rollout_to_json
    from gfcr.records import rollouts_to_table
    from gfcr.testing import make_rollout

    f = tmp_path / "r.jsonl"
    good = rollout_to_json(rollouts_to_table([make_rollout()]).to_pylist()[0])
    bad = dict(good, rollout_id="other", finish_reason="exploded")
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    msg = _refused(store, "jsonl", f, "finish_reason", "finish_reason", where="line 2")
    assert msg.count("field") == 1


def test_check_logprobs_worked_example():
    from gfcr.formats._common import check_logprobs

    assert check_logprobs([-0.5, 0, -1e-5 * 0], 3, "f", "line 1", "lp") == [-0.5, 0.0, 0.0]
    assert check_logprobs([5e-5], 1, "f", "w", "lp") == [5e-5]  # float32 round-off of log(1) is allowed
    with pytest.raises(ImportFormatError, match=r"f: line 3: field 'lp\[1\]': must be finite, got nan"):
        check_logprobs([-0.5, math.nan], 2, "f", "line 3", "lp")
    with pytest.raises(ImportFormatError, match="expected a number"):
        check_logprobs([True], 1, "f", "w", "lp")
