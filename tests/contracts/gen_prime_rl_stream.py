"""Generate the prime-rl trace-stream contract fixtures with prime-rl's own writer (not run in CI).

Since prime-rl PRs #3444/#3465 the file monitor writes every episode once, on arrival, to
``{output_dir}/monitors/file/traces/stream…`` with an index of byte offsets beside it, and what is
learned later (advantages, trainer log-probs) as per-producer *annotations* that readers fold back
onto the episode. Two on-disk layouts exist; each fixture is written by the writer modules of one:

* ``single/``: one ``stream.jsonl`` + ``stream.index.jsonl`` (``offset``), ``annotations/<producer>.jsonl``
  + ``<producer>.index.jsonl``. Source: Stars1233/prime-rl @ e3fdadedc5f51d7173b5da9a5ae6daad00b06f1d
  (a fork tracking upstream), ``src/prime_rl/monitors/file/{monitor.py,traces/__init__.py,
  traces/index.py,traces/update.py}``.
* ``chunked/``: ``stream/NNNNN.jsonl`` chunks (``chunk``, ``offset`` in the index), a full chunk sealed
  as seekable zstd ``NNNNN.jsonl.zst``, annotations as ``annotations/<producer>/NNNNN.jsonl[.zst]``.
  Sources: polyphilz/prime-rl @ 18f8bfa26b7f49862a94c78ad402bae64299e7f8 ``monitor.py`` and
  ``traces/__init__.py`` (no upstream copy of these two is in reach at a chunked commit);
  PrimeIntellect-ai/prime-rl @ 551bfc39ba61d9f0aec59780d4a3d7e5395f1fdc ``traces/chunks.py``,
  @ 65a185848115523d2feb2e110d04d05cfbea3a08 ``traces/update.py`` (adds the ``is_masked`` stream),
  @ 13e96a1254e9eae2564a5b6985ac5ada32ae0cc4 ``traces/index.py``. The fixture is left mid-run:
  full chunks sealed, the live chunk still plain (the monitor's ``finalize`` would seal it too);
  ``chunks.FRAME_BYTES`` is set to 700 (prime-rl: 4 MiB) and ``chunk_bytes`` to 1200, so a record
  spans several seekable frames and every episode has a chunk of its own.

The episode records are the ones verifiers 0.4.0's ``Episode.to_record()`` wrote for the folder
fixture (``fixtures/prime_rl/rollouts/step_4/train/all`` and ``step_3/eval/all``, made by
``gen_prime_rl.py``), replayed through the stream writer; the updates are built with prime-rl's
``make_update`` the way the orchestrator (ship-time ``info``) and the trainer (per-token streams,
full length over the branch, nulls where unknown) produce them. ``expected.json`` holds, per trace,
the record after prime-rl's own ``fold_trace_updates`` (producers in name order, each in write
order, as prime-rl's dashboard ``annotation_index``/``trace_updates`` read them).

prime-rl's config, monitor base, pathing and ``verifiers`` imports are stubbed (``_stubs.py`` and
the small stand-ins below; ``get_file_monitor_dir`` is prime-rl's ``output_dir / "monitors" / "file"``).
Run on demand, with each layout's files exported from git under ``<src>/src/prime_rl/...``:

    python -m venv /tmp/genvenv && /tmp/genvenv/bin/pip install orjson pyzstd
    /tmp/genvenv/bin/python tests/contracts/gen_prime_rl_stream.py SINGLE_SRC CHUNKED_SRC \\
        tests/contracts/fixtures/prime_rl_stream
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import logging
import shutil
import sys
import types
from pathlib import Path

from _stubs import StubFinder  # this folder is on sys.path when run as a script

HERE = Path(__file__).resolve().parent
EPISODES = [HERE / "fixtures/prime_rl/rollouts/step_4/train/all/traces.jsonl",
            HERE / "fixtures/prime_rl/rollouts/step_3/eval/all/traces.jsonl"]


class _Config:
    """``FileMonitorConfig``'s fields the monitor reads (defaults but a small chunk size)."""
    path = "metrics.jsonl"
    chunk_bytes = 1200
    compress = True
    float_decimals = None


class _Monitor:
    """``prime_rl.monitors.base.Monitor``: holds the config and a logger."""

    def __init__(self, config):
        self.config = config
        self.logger = logging.getLogger("file-monitor")


class _Recorded:
    """An episode whose ``to_record()`` is the record verifiers wrote (``float_decimals`` ignored:
    the record is already serialized)."""

    def __init__(self, record):
        self.record = record

    def to_record(self, **_kw):
        return copy.deepcopy(self.record)


def _wire_episode():
    """``verifiers.v1.WireEpisode`` for ``index.summarize_episode`` (only its token counts)."""

    class WireEpisode:
        @classmethod
        def model_validate(cls, rec, extra=None):
            e = cls()
            nodes = [n for t in rec.get("traces") or [] for n in t.get("nodes") or []]
            e.num_input_tokens = sum(len(n.get("token_ids") or []) for n in nodes if not n.get("sampled"))
            e.num_output_tokens = sum(len(n.get("token_ids") or []) for n in nodes if n.get("sampled"))
            return e
    return WireEpisode


def _install_stubs() -> None:
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m
    for pkg in ("prime_rl", "prime_rl.monitors", "prime_rl.monitors.file", "prime_rl.configs", "prime_rl.utils"):
        mod(pkg)
    mod("prime_rl.configs.monitors", FileMonitorConfig=_Config)
    mod("prime_rl.monitors.base", Kind=str, Subset=str, Monitor=_Monitor)
    mod("prime_rl.utils.pathing", get_file_monitor_dir=lambda out: Path(out) / "monitors" / "file")
    mod("prime_rl.utils.utils", sanitize=lambda m: (m, []))
    mod("verifiers")
    mod("verifiers.v1", WireEpisode=_wire_episode())
    sys.meta_path.append(StubFinder(["wandb", "prime_cli"]))


def _load(src: Path, name: str, package: bool = False):
    """Load one prime-rl module from ``src`` by file, under its own dotted name."""
    rel = Path("src", *name.split(".")) / "__init__.py" if package else Path("src", *name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, src / rel)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def _layout(src: Path, chunked: bool):
    for name in [n for n in list(sys.modules) if n.startswith("prime_rl.monitors.file.")]:
        del sys.modules[name]
    traces = _load(src, "prime_rl.monitors.file.traces", package=True)
    if chunked:  # frames of 700 bytes (prime-rl: 4 MiB) so that records straddle frames of the seek table
        _load(src, "prime_rl.monitors.file.traces.chunks").FRAME_BYTES = 700
    _load(src, "prime_rl.monitors.file.traces.index")
    update = _load(src, "prime_rl.monitors.file.traces.update")
    monitor = _load(src, "prime_rl.monitors.file.monitor")
    return traces, update, monitor


def _records() -> list[dict]:
    return [json.loads(line) for f in EPISODES for line in f.read_text().splitlines() if line.strip()]


def _updates(update, records: list[dict], chunked: bool) -> dict[str, list[dict]]:
    """Per producer, the updates in write order: the orchestrator ships the train group g1 (its
    credit, twice: the second, later, stamp wins), the trainer streams per-token values over each
    shipped branch (full length, null where unknown; one stream cut short, one with a null at a
    sampled token, to show what a fold keeps)."""
    by_id = {tr["id"]: tr for rec in records for tr in rec["traces"]}
    train = [rec for rec in records if rec["run"]["work"]["type"] == "train" and rec["traces"]]
    g1 = [rec["traces"][0]["id"] for rec in train if rec["group"]["id"] == "g1"]
    g2 = [rec["traces"][0]["id"] for rec in train if rec["group"]["id"] == "g2"]
    paths = {tid: update.branch_node_paths(tr["nodes"]) for tid, tr in by_id.items()}
    orch = [update.make_update(g1[0], info={"advantage": 0.2, "ship": {"step": 4}}),
            update.make_update(g1[1], info={"advantage": -0.2, "ship": {"step": 4}}),
            update.make_update(g1[0], info={"advantage": 0.3, "ship": {"step": 4, "batch": 0}})]
    trainer = []
    for k, tid in enumerate(g1 + g2):
        nodes = by_id[tid]["nodes"]
        branches = {}
        for b, path in enumerate(paths[tid]):
            streams: dict[str, list] = {"trainer_logprobs": [], "entropies": [], "advantages": []}
            if chunked:
                streams["is_masked"] = []
            for i in path:
                n = nodes[i]
                for j, m in enumerate(n["mask"]):
                    base = -0.01 * (j + 1) - 0.1 * b - 0.001 * i
                    streams["trainer_logprobs"].append(round(base, 6) if m else None)
                    streams["entropies"].append(round(0.5 + 0.01 * j, 6) if m else None)
                    streams["advantages"].append((0.3 if k == 0 else -0.2 if k == 1 else 0.0) if m else None)
                    if chunked:
                        streams["is_masked"].append(bool(j % 2) if m else None)
            if k == 1:  # a stream cut before the last node: the tail node keeps no trainer values
                streams["trainer_logprobs"] = streams["trainer_logprobs"][:-2]
            if k == 2 and b == 1:  # a null at a sampled token: that node takes no entropies
                s = streams["entropies"]
                s[max(i for i, v in enumerate(s) if v is not None)] = None
            branches[b] = streams
        trainer.append(update.make_update(tid, branches=branches))
    return {"orchestrator": orch, "trainer": trainer}


def _write(monitor, out: Path, records: list[dict], updates: dict[str, list[dict]], chunked: bool) -> None:
    async def run():
        fm = monitor.FileMonitor(_Config())
        await fm.init(output_dir=out)
        for rec in records:  # arrival order, one episode at a time as they complete
            await fm.log_episodes([_Recorded(rec)], step=4, kind=rec["run"]["work"]["type"], subset="all")
        for producer, ups in updates.items():  # each producer is its own monitor (own stream)
            pm = monitor.FileMonitor(_Config())
            await pm.init(output_dir=out, producer=producer)
            for u in ups:
                await pm.log_annotations([u])
            if chunked:
                for stream, index in pm._streams.values():  # left mid-run: no finalize (the live chunk stays plain)
                    stream.flush()
                    for t in stream._sealing:
                        t.join()
                    stream.file.close()
                    index.close()
            pm.file.close()
        if chunked:
            for stream, index in fm._streams.values():
                for t in stream._sealing:
                    t.join()
                stream.file.close()
                index.close()
        fm.file.close()

    asyncio.run(run())
    (out / "monitors" / "file" / "metrics.jsonl").unlink(missing_ok=True)


def _expected(update, records: list[dict], updates: dict[str, list[dict]]) -> dict:
    """Each trace after prime-rl's own fold: its info and, per node, the folded streams."""
    exp = {}
    ordered = [u for producer in sorted(updates) for u in updates[producer]]
    for rec in records:
        for tr in copy.deepcopy(rec["traces"]):
            nodes_with_lps = update.fold_trace_updates(tr, [u for u in ordered if u["trace_id"] == tr["id"]])
            exp[tr["id"]] = {
                "episode": rec["id"], "info": tr.get("info"), "nodes_with_trainer_logprobs": nodes_with_lps,
                "nodes": [{k: n.get(k) for k in ("advantages", "trainer_logprobs", "entropies", "is_masked", "logprobs")}
                          for n in tr["nodes"]],
                "paths": update.branch_node_paths(tr["nodes"]),
            }
    return exp


def main(single_src: str, chunked_src: str, out: str) -> None:
    _install_stubs()
    out_p = Path(out)
    records = _records()
    for name, src, chunked in (("single", single_src, False), ("chunked", chunked_src, True)):
        _traces, update, monitor = _layout(Path(src), chunked)
        target = out_p / name
        shutil.rmtree(target, ignore_errors=True)
        ups = _updates(update, records, chunked)
        _write(monitor, target, records, ups, chunked)
        (target / "expected.json").write_text(json.dumps(_expected(update, records, ups), indent=1))
        print(name, sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main(*sys.argv[1:4])
