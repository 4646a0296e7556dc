"""A local, read-only web viewer of one rollout store (FastAPI).

``create_app(store_path)`` builds the app; ``gfcr view STORE`` serves it on 127.0.0.1. The app
serves exactly one store and only reads it (GET routes only). Static files come from a fixed
table loaded from this package at start-up, so no request path can reach any other file. The
page renders every string from the store with ``textContent`` (never as HTML), and responses
carry a Content-Security-Policy that allows only the app's own script and style.

JSON API:

* ``GET /api/summary`` — runs (steps, rollouts), tasks, finish reasons, audit judges (with the
  default one, ``default_judge``), and the tokenizer the token strip is decoded with (``tokenizer``: ``name``, ``source``, ``note``).
* ``GET /api/rollouts`` — filters ``run``, ``step_min``, ``step_max``, ``reward_min``,
  ``reward_max``, ``verified``, ``prompt``, ``task``, ``finish``, and (:mod:`gfcr.diagnose.listing`)
  ``q`` (text in any turn, case-insensitive), ``gen_min`` / ``gen_max`` (generated tokens),
  ``audit`` (``kept``/``discarded``/``none`` for the shown ``judge``); ``sort`` (run, step, prompt,
  sample, task, reward, verified, finish, gen) and ``order`` (asc/desc); paging ``offset``, ``limit``
  (≤ 200); by default sorted by run, step, prompt, sample index. With run/step filters only, the page is
  planned on a per-step index (:mod:`gfcr.diagnose.paging`, built once per store version) and
  only the steps it shows are read; other filters are one pushed-down filtered scan; ``q`` goes through
  the store's text index when it has one (:mod:`gfcr.store.textindex`). Returns
  ``{total, offset, limit, search, items}`` (``search``: ``"index"``, ``"scan"`` or None, how ``q`` was
  answered); each item carries the prompt's text (``prompt_text``, its last user turn, cut to 200 characters).
* ``GET /api/histogram`` — ``field`` (``reward`` or ``gen``), ``bins`` (≤ 100) and the list's filters:
  equal-width bars of the listed rows (:func:`gfcr.diagnose.listing.histogram_bars`), each with the
  smallest and largest value in it (the range a click on the bar filters to); once per version and filters.
* ``GET /api/lineage`` — ``run``, ``step``: the rollouts that trained the checkpoint after that step
  (:func:`gfcr.store.lineage.lineage`), fresh and replayed, and the uses per training step.
* ``GET /api/rollouts/{rollout_id}`` — one rollout: turns, tokens (each decoded with the store's
  tokenizer), verifier evidence, signals, its group's siblings, and each ROSS audit with its
  excluded spans and the assistant text cut into supervised / excluded segments. ``judge``
  (optional) names whose audit the mask overlay and ``audit`` show (default: the ROSS judge,
  :mod:`gfcr.diagnose.audits`); the reply's ``judge`` says which. 404 for an unknown id.
* ``GET /api/ross`` — ``judge`` (optional, as above), ``run``: that judge's TER per step,
  token-pooled as ``gfcr ross analyze`` computes it.

The tokenizer: ``--tokenizer`` when given; else the model the store records (``sampling.model``
of its rollouts, written by the engines), loaded from local files only (the viewer never
downloads); else token ids, with a note saying why.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from gfcr.diagnose.audits import latest_audits, resolve_judge, ter_by_step
from gfcr.diagnose.listing import AUDIT_STATES, HIST_FIELDS, SORT_COLUMNS, gen_counts, histogram_bars, refine
from gfcr.diagnose.paging import read_page, select_steps, step_index
from gfcr.diagnose.paired import paired_prompts
from gfcr.diagnose.spans import segments
from gfcr.diagnose.tokenizer import resolve_tokenizer
from gfcr.records import FINISH_REASONS, assistant_text
from gfcr.store.lineage import lineage
from gfcr.store.reads import rollout_filter
from gfcr.store.stepstats import CONTROL_JUDGES
from gfcr.store.textindex import search as text_search

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8"}
LIST_COLUMNS = ["rollout_id", "run_id", "step", "prompt_id", "group_id", "sample_index", "task", "reward",
                "verified", "finish_reason", "cost"]
MAX_TOKENS_SHOWN = 4000
MAX_INT = 2**63 - 1  # the largest step / offset a query may name (the store's int64 columns)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def load_static() -> dict[str, tuple[bytes, str]]:
    """The viewer's static files, read from the package: ``{name: (bytes, media type)}``."""
    out = {}
    for f in resources.files("gfcr.diagnose").joinpath("static").iterdir():
        suffix = Path(f.name).suffix
        if f.is_file() and suffix in STATIC_TYPES:
            out[f.name] = (f.read_bytes(), STATIC_TYPES[suffix])
    if "index.html" not in out:
        raise RuntimeError("gfcr.diagnose/static/index.html is missing from the installed package; reinstall gfcr")
    return out


def host_allowed(header: str | None, allowed: list[str] | tuple[str, ...]) -> bool:
    """Does a ``Host`` header name one of ``allowed`` (host names or IP literals, brackets optional)?

    The header must be exactly ``name`` or ``name:port`` (port all digits), or ``[v6]`` /
    ``[v6]:port``; names compare case-insensitively and with one trailing dot dropped (the
    fully-qualified form ``localhost.`` names the same host). Anything else is refused.

    Example: allowed ["localhost", "::1"]: "localhost:8765", "LOCALHOST.", "[::1]:80" → True;
    "localhost.evil.example", "localhost..", "[::1]evil.example", "[::1]:", "" → False.
    """
    if not header:
        return False
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        name, rest = (h[1:end], h[end + 1:]) if end > 0 else ("", "x")
    else:
        name, _, port = h.partition(":")
        rest = ":" + port if _ else ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return False
    if name.endswith("."):
        name = name[:-1]
    return bool(name) and name in {a.lower().strip("[]") for a in allowed}


def jsonable(x: Any) -> Any:
    """``x`` with non-finite floats as None and datetimes as ISO strings (JSON without NaN)."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if hasattr(x, "isoformat"):
        return x.isoformat()
    return x


def _loads(s: str | None) -> Any:
    if s is None:
        return None
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def role_runs(token_role: list[int]) -> list[dict[str, int]]:
    """Consecutive runs of equal role: ``[{"role", "start", "end"}]`` (end exclusive).

    Example: [0, 0, 1, 1, 1, 0] → [{0, 0, 2}, {1, 2, 5}, {0, 5, 6}].
    """
    out: list[dict[str, int]] = []
    for i, r in enumerate(token_role):
        if out and out[-1]["role"] == r:
            out[-1]["end"] = i + 1
        else:
            out.append({"role": int(r), "start": i, "end": i + 1})
    return out


def token_overlays(ids: list[int], role: list[int], logprobs: list[float], signals: dict[str, float],
                   meta: dict[str, Any], audit: dict[str, Any] | None, pieces: list[str | None],
                   assistant: str, limit: int = MAX_TOKENS_SHOWN) -> dict[str, Any]:
    """Per-token series for the token strip's overlays, each ``[min(T, limit)]`` or None when the
    store does not hold it, with a note per overlay saying where it came from.

    * ``logprob`` — the behaviour (sampler) log-prob of each generated token (None on context);
    * ``entropy`` — ``meta["token_entropy"]`` when stored, else the surprisal −log p of the sampled
      token (a one-sample estimate of the entropy at that position; the note says which);
    * ``gap`` — trainer − sampler log-prob (:func:`gfcr.diagnose.health.trainer_logprobs`);
    * ``advantage`` — per-token advantages kept from a verl batch, else ``signals["advantage"]``
      on every generated token;
    * ``loss_mask`` — ``token_role`` (1: in the policy loss);
    * ``ross_mask`` / ``ross_category`` — the shown judge's latest audit's mask when kept, and for each excluded
      generated token the category of the excluded span it lies in (located through the decoded
      pieces' character offsets in the assistant text; "excluded" when the tokens are not decoded
      or a piece is not found).

    Example: role [0, 1], logprobs [0, -0.5], signals {"advantage": 1.0}, no audit →
    logprob [None, -0.5], entropy [None, 0.5], advantage [None, 1.0], loss_mask [0, 1], gap None.
    """
    from gfcr.diagnose.health import trainer_logprobs

    n = min(len(ids), limit)
    gen = [r == 1 for r in role[:n]]
    notes: dict[str, str] = {}
    out: dict[str, Any] = {"loss_mask": [int(r) for r in role[:n]]}
    out["logprob"] = [float(x) if g else None for x, g in zip(logprobs[:n], gen, strict=True)]
    te = meta.get("token_entropy")
    if isinstance(te, list) and len(te) == len(ids):
        out["entropy"] = [float(x) if g else None for x, g in zip(te[:n], gen, strict=True)]
        notes["entropy"] = "per-token entropy stored with the rollout (meta.token_entropy)"
    else:
        out["entropy"] = [-float(x) if g else None for x, g in zip(logprobs[:n], gen, strict=True)]
        notes["entropy"] = "per-token entropy not stored: −log p of the sampled token (a one-sample estimate)"
    tl = trainer_logprobs(meta, len(ids))
    out["gap"] = None if tl is None else [float(t - b) if g else None
                                           for t, b, g in zip(tl[:n], logprobs[:n], gen, strict=True)]
    notes["gap"] = "trainer − sampler log-prob" if tl is not None else "the store holds no trainer log-probs for this rollout"
    adv = None
    v = meta.get("verl") if isinstance(meta.get("verl"), dict) else None
    if v and isinstance((v.get("per_token") or {}).get("advantages"), list):
        a = list(v["per_token"]["advantages"])
        if (v.get("layout") or {}).get("advantages") == "response":
            a = [0.0] * int(v.get("n_prompt", 0)) + a
        if len(a) == len(ids):
            adv = [float(x) if g else None for x, g in zip(a[:n], gen, strict=True)]
            notes["advantage"] = "per-token advantages of the verl batch"
    if adv is None and isinstance(signals.get("advantage"), int | float):
        adv = [float(signals["advantage"]) if g else None for g in gen]
        notes["advantage"] = "the rollout's advantage (signals.advantage), on every generated token"
    out["advantage"] = adv
    if adv is None:
        notes["advantage"] = "no advantage stored"
    out["ross_mask"], out["ross_category"] = None, None
    if audit is not None and audit.get("status") == "kept" and len(audit.get("mask") or []) >= n:
        mask = [int(m) for m in audit["mask"][:n]]
        cats: list[str | None] = [None] * n
        pos = 0
        for i in range(n):
            piece = pieces[i] if i < len(pieces) else None
            at = -1
            if gen[i] and piece:
                at = assistant.find(piece, pos)
                if at >= 0:
                    pos = at + len(piece)
            if gen[i] and mask[i] == 0:
                cats[i] = "excluded"
                for sp in audit.get("excluded") or []:
                    if at >= 0 and sp["start"] < at + len(piece or "") and at < sp["end"]:
                        cats[i] = sp["category"]
                        break
        out["ross_mask"], out["ross_category"] = mask, cats
        notes["ross_mask"] = f"audit {audit.get('judge')}@{audit.get('judge_version')}"
    else:
        notes["ross_mask"] = (f"no kept ROSS audit by {audit.get('judge')}@{audit.get('judge_version')} "
                              f"({audit.get('status')})") if audit is not None else "no ROSS audit by the shown judge"
    out["notes"] = notes
    return out


def prompt_text(messages: list[dict[str, Any]], limit: int = 200) -> str:
    """The prompt as a list shows it: the last user turn before the first assistant turn (else the
    first turn), whitespace collapsed, cut to ``limit`` characters."""
    text = ""
    for m in messages:
        if m["role"] == "assistant":
            break
        if m["role"] == "user" or not text:
            text = m.get("content") or ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def create_app(store_path: str | Path, tokenizer: Any | None = None, allowed_hosts: list[str] | None = None) -> Any:
    """The FastAPI app over the store at ``store_path`` (which must exist). ``tokenizer``: an HF
    tokenizer, or a path/name to load one from; None decodes with the store's own model when it
    records one (:func:`resolve_tokenizer`). ``allowed_hosts``: the only ``Host`` header names
    answered (``gfcr view`` passes the loopback names on a loopback bind, against DNS rebinding);
    None answers any.

    Long because: the routes are closures over the opened store, its tokenizer and the static files; each
    route is a few lines, and moving them out would hand that state to every one.
    """
    from fastapi import Depends, FastAPI, HTTPException, Query
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

    from gfcr.store import RolloutStore

    store = RolloutStore.open(store_path)  # raises a StoreError naming the problem if it is not a store
    static = load_static()
    tok, tok_info = resolve_tokenizer(store, tokenizer)
    cache: dict[str, Any] = {"version": None}

    def current() -> tuple[Any, Any, dict[str, Any]]:
        """The rollouts dataset at its latest version, its per-step index and per-version facts
        (built once per version: an append moves the version and the next request rebuilds)."""
        ds = store.dataset("rollouts")
        if cache["version"] != ds.version:
            cache.update(version=ds.version, index=step_index(ds), facts={})
        return ds, cache["index"], cache["facts"]

    app = FastAPI(title="gfcr viewer", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Any, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": ("query",), "msg": "invalid request"}
        where = ".".join(str(x) for x in err.get("loc", ())[1:]) or "request"
        return JSONResponse({"detail": f"bad value for {where!r}: {err.get('msg', 'invalid')}"}, status_code=400)

    @app.middleware("http")
    async def _headers(request: Any, call_next: Any) -> Any:
        if allowed_hosts is not None and not host_allowed(request.headers.get("host"), allowed_hosts):
            resp: Any = JSONResponse({"detail": f"Invalid host header {request.headers.get('host')!r}: this viewer "
                                                f"only answers requests addressed to {', '.join(allowed_hosts)}"},
                                     status_code=400)
        else:
            resp = await call_next(request)
        for k, v in SECURITY_HEADERS.items():
            resp.headers[k] = v
        return resp

    def _static(name: str) -> Response:
        if name not in static:
            raise HTTPException(404, f"no static file {name!r}")
        body, media = static[name]
        return Response(body, media_type=media)

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return _static("index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)  # no icon; without this route browsers log a 404

    @app.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> Response:
        return _static(name)

    @app.get("/api/summary")
    def summary() -> JSONResponse:
        _, index, facts = current()
        runs = []
        if index.num_rows:  # the per-step index of the list pages: runs from it, no scan
            g = index.group_by("run_id").aggregate([("step", "min"), ("step", "max"), ("n", "sum")])
            g = g.take(pc.sort_indices(g, sort_keys=[("run_id", "ascending")]))
            runs = [{"run_id": r["run_id"], "step_min": r["step_min"], "step_max": r["step_max"], "rollouts": r["n_sum"]}
                    for r in g.to_pylist()]
        if "tasks" not in facts:
            facts["tasks"] = store.sql("SELECT DISTINCT task FROM rollouts ORDER BY task").column("task").to_pylist() \
                if runs else []
        tasks = facts["tasks"]
        default, counts = resolve_judge(store)
        judges = [{"judge": j, "n": n, "control": j in CONTROL_JUDGES} for j, n in sorted(counts.items())]
        return JSONResponse({"store": str(store.path), "runs": runs, "tasks": tasks,
                             "finish_reasons": list(FINISH_REASONS), "judges": judges, "default_judge": default,
                             "tokenizer": tok_info})

    def _judge(judge: str | None) -> str | None:
        try:
            return resolve_judge(store, judge or None)[0]
        except ValueError as e:
            raise HTTPException(400, str(e)) from None

    @app.get("/api/ross")
    def ross(judge: str | None = None, run: str | None = None) -> JSONResponse:
        j = _judge(judge)
        return JSONResponse(jsonable({"judge": j, "ter_by_step": ter_by_step(store, j, run or None)}))

    @app.get("/api/paired")
    def paired(a: str | None = Query(None, max_length=200), b: str | None = Query(None, max_length=200)) -> JSONResponse:
        if not a or not b:
            raise HTTPException(400, "name both runs: /api/paired?a=RUN_A&b=RUN_B")
        try:
            return JSONResponse(jsonable(paired_prompts(store, a, b)))
        except ValueError as e:
            raise HTTPException(400, str(e)) from None

    def list_filters(
        run: str | None = None,
        step_min: int | None = Query(None, ge=0, le=MAX_INT),
        step_max: int | None = Query(None, ge=0, le=MAX_INT),
        reward_min: float | None = None,
        reward_max: float | None = None,
        verified: bool | None = None,
        prompt: str | None = None,
        task: str | None = None,
        finish: str | None = None,
        q: str | None = Query(None, max_length=200),
        gen_min: int | None = Query(None, ge=0, le=MAX_INT),
        gen_max: int | None = Query(None, ge=0, le=MAX_INT),
        audit: str | None = None,
        judge: str | None = None,
    ) -> dict[str, Any]:
        """The list's filters (shared by the list and its histograms), checked; ``where``: the Lance
        predicate of the reward bounds and the finish reason."""
        if audit is not None and audit not in AUDIT_STATES:
            raise HTTPException(400, f"audit must be one of {list(AUDIT_STATES)}")
        where = []
        for v, op in ((reward_min, ">="), (reward_max, "<=")):
            if v is not None:
                if not np.isfinite(v):
                    raise HTTPException(400, "reward bounds must be finite numbers")
                where.append(f"reward {op} {float(v)!r}")
        if finish is not None:
            if finish not in FINISH_REASONS:
                raise HTTPException(400, f"finish must be one of {list(FINISH_REASONS)}")
            where.append(f"finish_reason = '{finish}'")
        steps = None
        if step_min is not None or step_max is not None:
            steps = (step_min or 0, step_max if step_max is not None else MAX_INT)
        return {"run": run or None, "step_min": step_min, "step_max": step_max, "steps": steps, "verified": verified,
                "prompt": prompt or None, "task": task or None, "where": " AND ".join(where) or None, "q": q or None,
                "gen_min": gen_min, "gen_max": gen_max, "audit": audit, "judge": judge}

    def matching(f: dict[str, Any], cols: list[str], sort: str | None = None, order: str = "asc",
                 ordered: bool = True) -> tuple[Any, str | None]:
        """The rows passing every filter, with ``cols`` (plus what the filters need), and how the text
        was searched: ``"index"`` (the store's text index, :mod:`gfcr.store.textindex`), ``"scan"``, None."""
        ds, _, _ = current()
        need = list(cols) + (["token_role"] if (f["gen_min"] is not None or f["gen_max"] is not None or sort == "gen")
                             and "token_role" not in cols else [])
        t, q, searched = None, f["q"], None
        if q:
            flt = rollout_filter(f["run"], f["steps"], f["verified"], [f["prompt"]] if f["prompt"] else None, f["task"],
                                 f["where"])
            t = text_search(ds, q, need, flt)
            searched = "scan" if t is None else "index"
            q = q if t is None else None  # matched by the index already
            need += ["messages"] if t is None else []
        if t is None:
            t = store.scan(run=f["run"], steps=f["steps"], verified=f["verified"],
                           prompt_ids=[f["prompt"]] if f["prompt"] else None, task=f["task"], where=f["where"], columns=need)
        statuses = None
        if f["audit"] is not None:
            j = _judge(f["judge"])
            statuses = {a["rollout_id"]: a["status"] for a in latest_audits(
                store, t.column("rollout_id").to_pylist(), j).values()} if j else {}
        t = refine(t, q=q, gen_min=f["gen_min"], gen_max=f["gen_max"], audits=statuses, audit=f["audit"], sort=sort,
                   order=order, ordered=ordered)
        return t, searched

    @app.get("/api/rollouts")
    def list_rollouts(
        f: dict[str, Any] = Depends(list_filters),
        sort: str | None = None,
        order: str = "asc",
        offset: int = Query(0, ge=0, le=MAX_INT),
        limit: int = Query(50, ge=1, le=200),
    ) -> JSONResponse:
        if sort is not None and sort not in SORT_COLUMNS:
            raise HTTPException(400, f"sort must be one of {list(SORT_COLUMNS)}")
        if order not in ("asc", "desc"):
            raise HTTPException(400, "order must be asc or desc")
        refined = bool(f["q"]) or f["gen_min"] is not None or f["gen_max"] is not None or f["audit"] is not None \
            or sort is not None
        searched = None
        if not f["where"] and f["verified"] is None and not f["prompt"] and not f["task"] and not refined:
            # run / step filters only: the per-step index plans the page; only its steps are read
            ds, index, _ = current()
            sel = select_steps(index, f["run"], f["step_min"], f["step_max"])
            total = int(pc.sum(sel.column("n")).as_py() or 0)
            t = read_page(ds, sel, offset, limit, LIST_COLUMNS + ["token_role", "messages"]) if offset < total else None
        else:  # other filters: one pushed-down filtered scan (or the text index), sorted
            t, searched = matching(f, LIST_COLUMNS, sort, order)
            total = t.num_rows
            if total:
                t = t.slice(offset, limit)
        items = []
        page = t.select(LIST_COLUMNS).to_pylist() if total and t is not None else []
        if page:  # generated-token counts and prompt text for this page only (token_role is the truth)
            extra = t if {"token_role", "messages"} <= set(t.column_names) else store.get([r["rollout_id"] for r in page],
                                                                       columns=["token_role", "messages"])
            roles = extra.column("token_role")
            gen = pc.list_value_length(roles).to_pylist()
            flat = pc.list_flatten(roles).to_numpy(zero_copy_only=False).astype(np.int64)
            sums = np.bincount(np.repeat(np.arange(len(page)), gen), weights=flat, minlength=len(page))
            for r, n, sm, msgs in zip(page, gen, sums, extra.column("messages").to_pylist(), strict=True):
                cost = r.pop("cost")
                r["gen_tokens"] = int(sm) if n else int(cost["gen_tokens"])
                r["prompt_text"] = prompt_text(msgs)
                items.append(jsonable(r))
        return JSONResponse({"total": total, "offset": offset, "limit": limit, "search": searched, "items": items})

    @app.get("/api/histogram")
    def histogram(field: str = "reward", bins: int = Query(20, ge=1, le=100),
                  f: dict[str, Any] = Depends(list_filters)) -> JSONResponse:
        if field not in HIST_FIELDS:
            raise HTTPException(400, f"field must be one of {list(HIST_FIELDS)}")
        _, _, facts = current()
        key = (field, bins, tuple(sorted((k, str(v)) for k, v in f.items())))
        hists = facts.setdefault("histograms", {})
        if key not in hists:  # once per store version and filter set
            t, _ = matching(f, ["rollout_id", "reward"] + (["token_role"] if field == "gen" else []), ordered=False)
            if field == "gen":
                values = gen_counts(t.column("token_role")).astype(np.float64)
            else:
                values = t.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)
            if len(hists) > 64:
                hists.clear()
            hists[key] = {"field": field, **histogram_bars(values, bins, integer=field == "gen")}
        return JSONResponse(jsonable(hists[key]))

    @app.get("/api/lineage")
    def lineage_route(run: str | None = Query(None, max_length=200), step: int | None = Query(None, ge=0, le=MAX_INT),
                      limit: int = Query(500, ge=1, le=5000)) -> JSONResponse:
        if not run or step is None:
            raise HTTPException(400, "name both run and step: /api/lineage?run=RUN&step=N (the checkpoint after step N)")
        try:
            lin = lineage(store, run, step)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        used = [asdict(u) for u in lin.used]
        return JSONResponse(jsonable({
            "run": lin.run, "step": lin.step, "n_used": len(used),
            "fresh_uses": sum(c["fresh"] for c in lin.per_step.values()),
            "replayed_uses": sum(c["replayed"] for c in lin.per_step.values()),
            "per_step": [{"step": k, **c} for k, c in lin.per_step.items()],
            "unknown": len(lin.unknown), "used": used[:limit], "truncated": len(used) > limit}))

    @app.get("/api/rollouts/{rollout_id}")
    def get_rollout(rollout_id: str, judge: str | None = None) -> JSONResponse:
        shown_judge = _judge(judge)
        try:
            row = store.get([rollout_id]).to_pylist()[0]
        except KeyError:
            raise HTTPException(404, f"no rollout {rollout_id!r} in this store") from None
        role = row.pop("token_role")
        ids = row.pop("token_ids")
        lps = row.pop("logprobs")
        for k in ("verifier", "sampling", "meta"):
            row[k] = _loads(row[k])
        row["signals"] = dict(row["signals"])
        text = assistant_text(row["messages"])
        audits = []
        shown_audit: dict[str, Any] | None = None  # the shown judge's latest audit, with its full mask
        for a in sorted(store.audits(rollout_ids=[rollout_id]).to_pylist(), key=lambda a: a["created_at"]):
            mask = a.pop("mask")
            kept = a["status"] == "kept"
            spans = a["excluded"] if kept else []
            a["segments"] = [s.to_dict() for s in segments(text, spans, kept)]
            a["supervised_tokens"] = int(sum(m for m, r in zip(mask, role, strict=False) if r == 1))
            a["mask"] = mask[:MAX_TOKENS_SHOWN]
            a["shown"] = False
            if a["judge"] == shown_judge:
                shown_i, shown_audit = len(audits), {**a, "mask": mask}
            audits.append(a)
        if shown_audit is not None:  # the latest audit of the shown judge is the one the views draw
            audits[shown_i]["shown"] = True
        sib = store.scan(run=row["run_id"], steps=(row["step"], row["step"]), prompt_ids=[row["prompt_id"]],
                         columns=["rollout_id", "group_id", "sample_index", "reward", "verified", "finish_reason"])
        siblings = sorted((r for r in sib.to_pylist() if r.pop("group_id") == row["group_id"]),
                          key=lambda r: (r["sample_index"], r["rollout_id"]))
        tokens = []
        shown = ids[:MAX_TOKENS_SHOWN]
        pieces = [tok.decode([i]) for i in shown] if tok is not None else [None] * len(shown)
        overlays = token_overlays(ids, role, lps, row["signals"], row["meta"] if isinstance(row["meta"], dict) else {},
                                  shown_audit, pieces, text)
        for i, (tid, r, piece) in enumerate(zip(shown, role, pieces, strict=False)):
            tokens.append({"i": i, "id": tid, "role": r, "text": piece})
        row.update(
            assistant_text=text,
            segments=[s.to_dict() for s in segments(text, [], False)],
            n_tokens=len(ids),
            n_context=int(len(role) - sum(role)),
            n_generated=int(sum(role)),
            role_runs=role_runs(role),
            tokens=tokens,
            tokens_truncated=len(ids) > MAX_TOKENS_SHOWN,
            decoded=tok is not None,
            tokenizer=tok_info,
            audits=audits,
            judge=shown_judge,
            audit=next((a for a in audits if a["shown"]), None),
            siblings=siblings,
            overlays=overlays,
        )
        return JSONResponse(jsonable(row))

    return app


__all__ = ["LOOPBACK_NAMES", "create_app", "host_allowed", "jsonable", "load_static", "token_overlays", "prompt_text", "role_runs"]
