"""``gfcr store …``: create, fill, query and maintain a rollout store (thin wrappers over
:mod:`gfcr.store`), and ``gfcr store walkthrough``, a tour of the store on bundled sample dumps."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .common import QuietOpt, cli_tokenizer, fail, import_progress, json_default, removed_on_failure

console = Console()
MANIFEST_NAME = "gfcr-store.json"

store_app = typer.Typer(help="Create, fill, query and maintain a rollout store.", no_args_is_help=True)

StorePath = Annotated[str, typer.Argument(help="Store: a directory, or an s3://, gs://, az:// URI (docs/store.md).")]


def _open(path: str):  # noqa: ANN202
    from gfcr.store import RolloutStore

    return RolloutStore.open(path)


def _cell(v: Any, max_width: int) -> str:
    s = f"{v:.4g}" if isinstance(v, float) else str(v)
    s = " ".join(s.split()) if "\n" in s else s
    return s if len(s) <= max_width else s[: max_width - 1] + "…"


def print_rows(rows: list[dict[str, Any]], title: str | None = None, max_width: int = 60) -> None:
    """A rich table of dict rows (long cells shortened). When the columns cannot fit the terminal
    at a readable width, each row is printed as a block of ``column  value`` lines instead (as
    psql's expanded display), so an 80-column terminal never squeezes columns to a few letters."""
    if not rows:
        console.print("(no rows)")
        return
    keys = [str(k) for k in rows[0]]
    cells = [[_cell(v, max_width) for v in r.values()] for r in rows]
    natural = [max([len(k)] + [len(c[i]) for c in cells]) for i, k in enumerate(keys)]
    readable = [min(n, max(len(k), 12)) for n, k in zip(natural, keys, strict=True)]
    if sum(readable) + 3 * len(keys) + 1 > console.width:
        if title:
            console.print(title, style="italic", markup=False)
        kw = max(len(k) for k in keys)
        room = max(20, console.width - kw - 2)
        for i, row in enumerate(cells):
            console.print(f"-[ row {i + 1} ]" + "-" * max(0, min(console.width, kw + 40) - len(str(i + 1)) - 10),
                          style="dim", markup=False)
            for k, c in zip(keys, row, strict=True):
                console.print(f"{k.ljust(kw)}  {c if len(c) <= room else c[: room - 1] + '…'}", markup=False,
                              highlight=False, soft_wrap=True)
        return
    t = Table(title=title, show_lines=False)
    for k, n in zip(keys, readable, strict=True):
        t.add_column(k, overflow="fold", min_width=n)
    for row in cells:
        t.add_row(*row)
    console.print(t)


@store_app.command("init")
def init(path: StorePath) -> None:
    """Create an empty store (all tables created with their schemas) in a new or empty folder."""
    from gfcr.store import RolloutStore

    refuse_foreign_folder(path)
    s = RolloutStore.open(path, create=True)
    console.print(f"store ready at {s.path} (schema version {s.manifest['schema_version']}; commits: "
                  f"{s.location.commit_handler})", soft_wrap=True, highlight=False)


def refuse_foreign_folder(path: str | Path, run_folder_only: bool = False) -> None:
    """End the command in one line when ``path`` is a folder that holds files but no store (a store
    created among a dump's files would be read as part of the dump ever after). A run folder gets
    "did you mean RUN/store"; a store's own pieces (what a crashed init or a lost manifest leaves:
    ``*.lance``, locks, the aggregates file) are allowed."""
    from gfcr.store.integrity import MANIFEST
    from gfcr.store.location import locate

    loc = locate(path)
    if loc.remote:  # (a URI is a new prefix or a store: nothing of a dump lives at it)
        return
    path = loc.local
    if not path.is_dir() or (path / MANIFEST).exists():
        return
    if (path / "store" / MANIFEST).exists():
        fail(f"{path} is a run folder, not a store: did you mean {path / 'store'}?")
    if run_folder_only:
        return
    other = sorted(e.name for e in path.iterdir()
                   if not e.name.endswith((".lance", ".lock")) and e.name != "aggregates.parquet")
    if other:
        fail(f"{path} is not empty and is not a gfcr store (it holds {', '.join(other[:3])}"
             f"{', …' if len(other) > 3 else ''}); give the store a new or empty folder")


def check_line(t: Any, width: int = 0) -> str:
    """One line of ``gfcr store check`` for a table's report (:class:`gfcr.store.integrity` ``TableReport``).

    Example: ``rollouts  v7 · 78 rows, all readable · 6 fragments, none damaged · versions 1-7 readable ·
    digests 6/6 files``; a damaged table reads ``… · 70 of 78 rows readable · 6 fragments, damaged: 3,4 · …``.
    """
    damaged = [str(f.fragment_id) for f in t.fragments if not f.readable]
    ver = f"v{t.version}" + ("" if t.recorded_version == t.version else f" (recorded v{t.recorded_version})")
    rows = f"{t.rows} rows, all readable" if t.rows_readable == t.rows else f"{t.rows_readable} of {t.rows} rows readable"
    frags = f"{len(t.fragments)} fragments, " + (f"damaged: {','.join(damaged)}" if damaged else "none damaged")
    return (f"{t.name:<{width}}  {ver} · {rows} · {frags} · versions {_ranges(t.versions_readable)} readable · "
            f"digests {t.files_digested}/{t.files_digested + t.files_not_digested} files")


def _csv(v: str | None) -> list[str] | None:
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


@store_app.command("import")
def import_(
    path: StorePath,
    files: Annotated[list[Path], typer.Argument(help="Files or directories to import.")],
    from_: Annotated[str, typer.Option("--from", help="verl | trl | areal | prime-rl | prime-rl-stream | slime | roll | skyrl | open-instruct | atif | atropos | nemo-gym | art | jsonl | parquet")],
    run: Annotated[str | None, typer.Option(help="run_id for the imported rows (default import-FORMAT).")] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer (HF name or dir, or 'default') to retokenize text-only formats.")
    ] = None,
    trust_pickle: Annotated[
        bool, typer.Option("--trust-pickle", help="slime, skyrl: allow arbitrary unpickling (only for files you trust).")
    ] = False,
    reward_columns: Annotated[str | None, typer.Option(help="trl: the reward-function columns, comma-separated.")] = None,
    reward_weights: Annotated[str | None, typer.Option(help="trl: their weights (GRPOConfig.reward_weights), comma-separated.")] = None,
    reward_key: Annotated[str | None, typer.Option(help="slime: the key of a dict reward used for training (--reward-key).")] = None,
    verdict_key: Annotated[str | None, typer.Option(help="verl (default acc), trl: the field whose value > 0 means correct.")] = None,
    evals: Annotated[str, typer.Option(help="areal, prime-rl, prime-rl-stream, slime: evaluation rollouts into RUN-eval (separate) or skip.")] = "separate",
    vocab: Annotated[int | None, typer.Option(help="Refuse token ids >= this vocabulary size (default: int32 range).")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep polling for new content (Ctrl-C stops); progress on stderr.")] = False,
    interval: Annotated[float, typer.Option(help="--follow: seconds between polls.")] = 2.0,
    create: Annotated[bool, typer.Option(help="Create the store if it does not exist.")] = True,
    quiet: QuietOpt = False,
) -> None:
    """Import what is new in another framework's dump (a re-run skips rows already stored; each file's
    new rows are one commit; bad input writes nothing). --follow keeps importing a growing dump."""
    import signal
    import threading

    from gfcr.formats import follow as follow_dump
    from gfcr.formats import import_rollouts
    from gfcr.store import RolloutStore

    opts = dict(run_id=run, tokenizer=cli_tokenizer(tokenizer), trust_pickle=trust_pickle, reward_columns=_csv(reward_columns),
                reward_weights=[float(x) for x in _csv(reward_weights) or []] or None, reward_key=reward_key,
                verdict_key=verdict_key, evals=evals, vocab=vocab)
    missing = [str(f) for f in files if not f.exists()]
    if missing and not follow:  # before the store is opened: nothing is created
        fail(f"no such file or folder: {', '.join(missing)}")
    kept: BaseException | None = None
    refuse_foreign_folder(path)
    with removed_on_failure(path):  # a failed import into a new store leaves no store behind
        store = RolloutStore.open(path, create=create)
        before = store.count()
        if follow:
            stop = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            typer.echo(f"following {', '.join(map(str, files))} every {interval:g} s; Ctrl-C stops", err=True)
            try:
                res = follow_dump(store, from_, [str(f) for f in files], interval=interval, stop=stop.is_set,
                                  progress=lambda m: typer.echo(m, err=True), **opts)
            except Exception as e:  # rows the follow committed stay: the store is not removed
                if not _committed_since(store, before):
                    raise
                kept = e
        else:
            with import_progress(enabled=not quiet and sys.stderr.isatty()) as progress:
                res = import_rollouts(store, from_, [str(f) for f in files], progress=progress, **opts)
    if kept is not None:
        raise kept
    for n in res.notes:
        console.print(f"[yellow]note:[/] {n}")
    console.print(
        f"imported {res.written} new rollouts ({res.skipped} already stored) from {len(res.files)} file(s) "
        f"({res.format}, tokens: {res.tokens_source}); store now holds {before + res.written} rollouts"
    )


def _counts(written: int, skipped: int) -> str:
    """What a walkthrough import did, the rows already there first when nothing was new: ``24 new,
    0 already stored`` on a first run, ``24 already stored, 0 new`` on a re-run into the same store."""
    return f"{skipped} already stored, {written} new" if skipped and not written else \
        f"{written} new, {skipped} already stored"


def _committed_since(store: Any, before: int) -> bool:
    """Whether ``store`` holds more rollouts than ``before`` (unknown, e.g. unreadable: yes, keep it)."""
    try:
        return store.count() > before
    except Exception:  # noqa: BLE001 - a store that cannot be counted is never removed
        return True


@store_app.command("export")
def export_(
    path: StorePath,
    out: Annotated[Path, typer.Argument(help="Output file (must not exist).")],
    to: Annotated[str, typer.Option("--to", help="jsonl | parquet | atif (one ATIF v1.8 trajectory per line)")] = "jsonl",
    where: Annotated[str | None, typer.Option(help="DuckDB SQL predicate over rollouts, e.g. \"reward > 0\".")] = None,
) -> None:
    """Export rollouts in gfcr's own schema (importable again with --from jsonl/parquet)."""
    from gfcr.formats.export import export

    n = export(_open(path), to, out, where=where)
    console.print(f"wrote {n} rollouts to {out}")


@store_app.command("export-sft")
def export_sft_(
    path: StorePath,
    out: Annotated[Path, typer.Argument(help="Output .parquet file (must not exist).")],
    format_: Annotated[str, typer.Option("--format", help="tokens | messages | prompt-completion | slime")],
    where: Annotated[
        str | None, typer.Option(help="DuckDB SQL predicate over rollouts, e.g. \"verified\" or \"reward > 0\".")
    ] = None,
    dedup: Annotated[
        bool, typer.Option("--dedup/--no-dedup", help="Drop repeats of the same generated tokens per prompt.")
    ] = True,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer (HF name or dir, or 'default') to decode rollouts stored without an assistant turn.")
    ] = None,
    include_truncated: Annotated[
        bool, typer.Option("--include-truncated", help="Also export rollouts cut by the token limit (skipped by default).")
    ] = False,
) -> None:
    """Export rollouts as an SFT dataset for TRL, verl or slime (e.g. --where verified for RFT)."""
    from gfcr.formats.sft_export import export_sft

    res = export_sft(_open(path), out, format_, where=where, dedup=dedup, tokenizer=cli_tokenizer(tokenizer),
                     include_truncated=include_truncated)
    for reason, n in res["skipped"].items():
        console.print(f"[yellow]note:[/] skipped {n} rollout(s): {reason}")
    if res["dropped_fields"]:
        console.print(f"[yellow]note:[/] {res['dropped_fields']} message(s) had tool_calls/name, not exported")
    console.print(f"wrote {res['rows']} rows ({res['format']}; {res['matched']} matched, "
                  f"{res['duplicates_dropped']} duplicates dropped) to {out}")


@store_app.command("stats")
def stats(
    path: StorePath,
    run: Annotated[str | None, typer.Option(help="Only this run.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per run and step: rollouts, generated tokens, mean reward, verified share."""
    store = _open(path)
    rows = store.stats(run=run)
    if as_json:
        print(json.dumps(rows, default=json_default))
    else:
        print_rows(rows, title=f"{store.path} — {store.count()} rollouts, {store.count('prompts')} prompts")


@store_app.command("push")
def push(
    path: StorePath,
    to: Annotated[str, typer.Option("--to", help="Tracker: trackio (local-first) or wandb.")] = "trackio",
    project: Annotated[str, typer.Option(help="The tracker's project.")] = "gfcr",
    run: Annotated[str | None, typer.Option(help="The store's run to push (needed when it holds several).")] = None,
    name: Annotated[str | None, typer.Option(help="The tracker run's name (default: the store's run id).")] = None,
    steps: Annotated[str | None, typer.Option(help="Inclusive step range A:B.")] = None,
    samples: Annotated[int, typer.Option(min=0, help="Random rollouts per step in the table.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the per-step sample.")] = 0,
) -> None:
    """Push per-step numbers and a sample of rollouts per step to an experiment tracker."""
    from gfcr.integrations.trackers import make_tracker, push_store

    store = _open(path)
    rng = None
    if steps is not None:
        try:
            a, b = (int(x) for x in steps.split(":"))
        except ValueError:
            fail(f"--steps must be A:B (two integers), got {steps!r}")
        rng = (a, b)
    runs = sorted({r["run_id"] for r in store.stats()})
    if run is None and len(runs) > 1:
        fail(f"the store holds {len(runs)} runs; name one with --run ({', '.join(runs[:5])})")
    tracker = make_tracker(to, project, name or run or (runs[0] if runs else None), {"store": str(store.path)})
    try:
        n = push_store(store, tracker, run=run, steps=rng, samples=samples, seed=seed)
    finally:
        tracker.finish()
    console.print(f"pushed {n['steps']} step(s) and {n['rollouts']} sampled rollout(s) to {to} project {project!r}")


@store_app.command("lineage")
def lineage_(
    path: StorePath,
    checkpoint: Annotated[Path | None, typer.Option(help="A gfcr train checkpoint folder (its run and step are read from it).")] = None,
    run: Annotated[str | None, typer.Option(help="The run (with --step, instead of --checkpoint).")] = None,
    step: Annotated[int | None, typer.Option(help="The step after which the checkpoint was saved.")] = None,
    show: Annotated[int, typer.Option(min=0, help="Rollouts listed.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print every rollout used as a JSON line.")] = False,
) -> None:
    """Which stored rollouts trained a checkpoint: fresh and replayed, with the steps they trained at."""
    from dataclasses import asdict

    from gfcr.store.lineage import lineage

    if checkpoint is not None:
        state_file = checkpoint / "loop_state.json"
        if not state_file.is_file():
            fail(f"{checkpoint} is not a gfcr train checkpoint folder (no loop_state.json)")
        state = json.loads(state_file.read_text())
        run, step = state["run_id"], int(state["step"])
    if run is None or step is None:
        fail("name the checkpoint: --checkpoint DIR, or --run RUN --step N")
    lin = lineage(_open(path), run, step)
    if as_json:
        for u in lin.used:
            print(json.dumps(asdict(u), default=json_default))
        return
    n_fresh = sum(c["fresh"] for c in lin.per_step.values())
    n_rep = sum(c["replayed"] for c in lin.per_step.values())
    console.print(f"run {run} after step {step}: {len(lin.used)} rollouts trained it "
                  f"({n_fresh} fresh uses, {n_rep} replayed uses over {len(lin.per_step)} steps)"
                  + (f"; {len(lin.unknown)} rows do not record whether they were trained" if lin.unknown else ""))
    print_rows([{"step": s, **c} for s, c in lin.per_step.items()], title="uses per training step")
    if show:
        print_rows([{"rollout_id": u.rollout_id, "step": u.step, "trained_at": ",".join(map(str, u.trained_at)),
                     "prompt_id": u.prompt_id, "reward": u.reward} for u in lin.used[:show]],
                   title=f"first {min(show, len(lin.used))} of {len(lin.used)} (--json lists all)")


@store_app.command("query")
def query(
    path: StorePath,
    sql: Annotated[str, typer.Argument(help="DuckDB SQL over tables rollouts, prompts, audits, state.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON lines.")] = False,
    limit: Annotated[int, typer.Option(help="Rows shown in table mode.")] = 50,
) -> None:
    """Run a SQL query over the store."""
    rows = _open(path).sql(sql).to_pylist()
    if as_json:
        for r in rows:
            print(json.dumps(r, default=json_default))
    else:
        print_rows(rows[:limit], title=f"{len(rows)} row(s)" + (f", first {limit} shown" if len(rows) > limit else ""))


@store_app.command("versions")
def versions(path: StorePath, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List store versions (every commit of the rollouts table)."""
    store = _open(path)
    vs = store.versions()
    if as_json:
        print(json.dumps(vs, default=json_default))
    else:
        print_rows(vs)


@store_app.command("compact")
def compact(path: StorePath) -> None:
    """Merge small fragments and rebuild the rollout_id index (a new version; history is kept)."""
    store = _open(path)
    res = store.compact()
    print_rows([{"table": k, **v} for k, v in res.items()])


@store_app.command("index")
def index_text(path: StorePath) -> None:
    """Build the full-text index the viewer's search uses (prompts and completions), or add the rows
    appended since it was built (one commit). Rows not yet indexed are still searched, more slowly."""
    store = _open(path)
    res = store.index_text()
    if res["action"] == "empty":
        console.print("the store holds no rollouts; nothing to index")
        return
    console.print(f"text index {res['action']}: {res['rows_indexed']} of {res['rows']} rollouts indexed")


@store_app.command("check")
def check(
    path: StorePath,
    salvage_to: Annotated[Path | None, typer.Option("--salvage", help="Copy every readable row into this new store.")] = None,
    accept: Annotated[bool, typer.Option("--accept", help="Record the tables' current versions as the store's own "
                                         "(after moving a damaged newest version manifest aside, or to rewrite a "
                                         "lost gfcr-store.json).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Verify the whole store: its manifest, every version manifest and every fragment, read one by one.
    Exit 0 only when nothing is damaged; otherwise lists each damaged file and the rows still readable."""
    from gfcr.store import integrity
    from gfcr.store.core import TABLES, RolloutStore
    from gfcr.store.location import locate

    loc = locate(path)
    if loc.remote and (accept or salvage_to is not None):
        fail("--accept and --salvage work on local stores; on object storage, restore an earlier version "
             "(`gfcr store versions`) or copy the readable rows with the Python API (docs/store.md)")
    if not loc.remote and not Path(path).is_dir():
        fail(f"no store at {path}; check the path")
    refuse_foreign_folder(path, run_folder_only=True)
    tables = list(TABLES)
    if loc.remote:
        from gfcr.store.opening import check_remote

        rep = check_remote(loc, TABLES)
    elif accept:
        rep = integrity.accept(path, tables, integrity.new_manifest(tables))
    else:
        rep = integrity.check_store(path, tables)
    if as_json:
        print(json.dumps(rep.to_dict(), default=json_default))
    else:
        width = max(len(t.name) for t in rep.tables)
        for t in rep.tables:
            line = check_line(t, width)
            if loc.remote:
                line = line.rsplit(" · digests", 1)[0] + " · file digests not kept on object storage"
            console.print(line, highlight=False, soft_wrap=True)
        for p in rep.all_problems:
            console.print(f"[red]damaged:[/] {p}", highlight=False, soft_wrap=True)
        if rep.ok and not loc.remote and (Path(path) / "aggregates.parquet").exists():
            console.print("aggregates.parquet: left by an older gfcr, no longer read or written (per-step "
                          "metrics are derived from the rows on read); safe to delete", highlight=False, soft_wrap=True)
    if salvage_to is not None:
        copied = integrity.salvage(path, salvage_to, tables, lambda p: RolloutStore.open(p, create=True).path)
        console.print(f"salvaged into {salvage_to}: " + ", ".join(f"{k} {v} rows" for k, v in copied.items()),
                      soft_wrap=True, highlight=False)
    if not rep.ok:
        readable = sum(t.rows_readable for t in rep.tables if t.name == "rollouts")
        fail(f"store {path} is damaged ({len(rep.all_problems)} problem(s), first: {rep.all_problems[0]}); "
             f"{readable} rollout rows still read; see docs/store.md for what is recoverable")
    if accept:
        console.print(f"accepted: {MANIFEST_NAME} now records " + ", ".join(f"{t.name} v{t.version}" for t in rep.tables),
                      soft_wrap=True, highlight=False)
    console.print(f"ok: {path} verified", soft_wrap=True, highlight=False)


def _ranges(vs: list[int]) -> str:
    """``[1, 2, 3, 5]`` → ``"1-3,5"``."""
    out: list[str] = []
    for v in vs:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = out[-1].split("-")[0] + f"-{v}"
        else:
            out.append(str(v))
    return ",".join(out) or "-"


@store_app.command("walkthrough")
def walkthrough(
    path: Annotated[str | None, typer.Argument(help="Store directory or URI (default runs/walkthrough-<time>).")] = None,
) -> None:
    """Import the bundled sample dumps, print stats and run a query (a tour of the store)."""
    from gfcr.formats import import_rollouts
    from gfcr.store import RolloutStore
    from gfcr.store import samples as S

    path = path or str(Path("runs") / f"walkthrough-{time.strftime('%Y%m%d-%H%M%S')}")
    with removed_on_failure(path):
        store = RolloutStore.open(path, create=True)
        console.rule("gfcr store walkthrough")
        console.print(f"store: {store.path}")
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            dumps = [
                ("verl", S.write_verl(t / "verl"), "run-verl"),
                ("trl", S.write_trl(t / "trl"), "run-trl"),
                ("prime-rl", S.write_prime_rl(t / "prime"), "run-prime"),
                ("roll", S.write_roll(t / "roll"), "run-roll"),
            ]
            opts = {"trl": {"reward_columns": ["accuracy_reward", "format_reward"]}}
            for fmt, p, run in dumps:
                res = import_rollouts(store, fmt, [str(p)], run_id=run, **opts.get(fmt, {}))
                console.print(f"  {fmt} dump: {_counts(res.written, res.skipped)} (tokens: {res.tokens_source})")
    print_rows(store.stats(), title="per run and step")
    q = ("SELECT run_id, count(*) AS rollouts, avg(reward) AS mean_reward, "
         "sum(CASE WHEN tokens_source = 'engine' THEN 1 ELSE 0 END) AS token_faithful "
         "FROM rollouts GROUP BY run_id ORDER BY run_id")
    console.print(f"\nSQL> {q}")
    print_rows(store.sql(q).to_pylist())
    s = store.sample(3, seed=0, columns=["rollout_id", "run_id", "reward"])
    console.print(f"\n3 random rollouts: {s.column('rollout_id').to_pylist()}")
    console.print(f"versions: {[v['version'] for v in store.versions()]} — `gfcr store versions {store.path}`")


def register(app: typer.Typer) -> None:
    """Add ``gfcr store …`` to the top-level app."""
    app.add_typer(store_app, name="store")
