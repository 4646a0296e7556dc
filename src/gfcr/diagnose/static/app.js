// gfcr viewer: every string from the store is inserted with textContent, never as HTML.
"use strict";
const state = { offset: 0, limit: 25, total: 0, selected: null, runs: [], overlay: "role",
  judge: new URLSearchParams(location.search).get("judge") || "" };
const OVERLAYS = [["role", "supervision"], ["logprob", "log-prob"], ["entropy", "entropy"], ["gap", "trainer − sampler"],
  ["advantage", "advantage"], ["loss_mask", "loss mask"], ["ross_mask", "ROSS mask"]];
const CATEGORIES = ["corrected_mistake", "redundant_exploration", "abandoned_attempt", "incorrect_claim", "other"];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}
const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(3)) : String(v));

async function getJSON(url) {
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await r.json();
  if (!r.ok) throw new Error(typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail));
  return body;
}

function filterParams() {
  // the filters as URL parameters: what the list asks the API, and what the page's URL keeps
  const p = new URLSearchParams();
  for (const inp of document.querySelectorAll("#filters [name]")) if (inp.value !== "") p.set(inp.name, inp.value);
  if (!p.get("sort")) p.delete("order");
  if (document.getElementById("f-step-on").checked) {
    const v = document.getElementById("f-step").value;
    p.set("step_min", v); p.set("step_max", v);
  }
  if (state.judge) p.set("judge", state.judge);
  return p;
}

function query() {
  const p = filterParams();
  p.set("offset", state.offset); p.set("limit", state.limit);
  return p;
}

function saveUrl() {
  // every filter in the URL: a reload or a shared link opens the same list
  const p = filterParams();
  if (state.offset) p.set("offset", state.offset);
  if (state.limit !== 25) p.set("limit", state.limit);
  const runB = document.getElementById("f-run-b").value;
  if (runB) p.set("compare", runB);
  const s = p.toString();
  history.replaceState(null, "", location.pathname + (s ? "?" + s : "") + location.hash);
}

function restoreUrl() {
  // the filters a URL names, back into the form (unknown parameters are ignored)
  const p = new URLSearchParams(location.search);
  for (const inp of document.querySelectorAll("#filters [name]")) {
    const v = p.get(inp.name);
    if (v === null) continue;
    if (inp.tagName === "SELECT" && ![...inp.options].some((o) => o.value === v)) inp.append(el("option", { value: v, text: v }));
    inp.value = v;
  }
  const runB = document.getElementById("f-run-b");
  if (p.get("compare") && [...runB.options].some((o) => o.value === p.get("compare"))) runB.value = p.get("compare");
  const lim = Number(p.get("limit"));
  if ([25, 50, 100, 200].includes(lim)) state.limit = lim;
  document.getElementById("f-limit").value = String(state.limit);
  state.offset = Math.max(0, Number(p.get("offset")) || 0);
}

async function loadSummary() {
  const s = await getJSON("/api/summary");
  document.getElementById("store").textContent = s.store;
  const t = s.tokenizer || {};
  const tk = document.getElementById("tokenizer");
  tk.textContent = t.note ? t.note : `tokens decoded with ${t.name}${t.source === "store" ? " (the store's model)" : ""}`;
  tk.className = t.note ? "note warn" : "note";
  const run = document.getElementById("f-run");
  const runB = document.getElementById("f-run-b");
  state.runs = s.runs;
  for (const r of s.runs) {
    run.append(el("option", { value: r.run_id, text: `${r.run_id} (${r.rollouts})` }));
    runB.append(el("option", { value: r.run_id, text: r.run_id }));
  }
  sliderBounds();
  const fin = document.getElementById("f-finish");
  for (const f of s.finish_reasons) fin.append(el("option", { value: f, text: f }));
  const task = document.getElementById("f-task");
  for (const t of s.tasks) task.append(el("option", { value: t, text: t }));
  const js = document.getElementById("f-judge");
  for (const j of s.judges) js.append(el("option", { value: j.judge, text: `${j.judge} (${j.n}${j.control ? ", control" : ""})` }));
  if (!state.judge) state.judge = s.default_judge || "";
  js.value = state.judge;
  js.disabled = !s.judges.length;
  await loadRoss();
}

function judgeParam() { return state.judge ? `?judge=${encodeURIComponent(state.judge)}` : ""; }

async function loadRoss() {
  // the shown judge's TER per step, token-pooled as `gfcr ross analyze` computes it
  const box = document.getElementById("ross-ter");
  if (!state.judge) { box.textContent = "no ROSS audits"; return; }
  try {
    const r = await getJSON("/api/ross" + judgeParam());
    box.textContent = `ROSS judge ${r.judge} — TER per step: ` + (r.ter_by_step.map((x) =>
      `${x.run_id} ${x.step}: ${x.ter === null ? "–" : (100 * x.ter).toFixed(1) + "%"}`).join(" · ") || "none");
    box.dataset.judge = r.judge;
  } catch (e) { box.textContent = e.message; box.className = "note warn"; }
}

async function loadList() {
  const body = document.querySelector("#rollouts tbody");
  let data;
  try { data = await getJSON("/api/rollouts?" + query()); }
  catch (e) { body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "err", text: e.message }))); return; }
  state.total = data.total;
  saveUrl();
  const sort = document.getElementById("f-sort").value, order = document.getElementById("f-order").value;
  for (const th of document.querySelectorAll("#rollouts th[data-sort]")) {
    th.dataset.on = th.dataset.sort === sort ? order : "";
    th.title = `sort by ${th.textContent}`;
  }
  body.replaceChildren(...data.items.map((r) => {
    const tr = el("tr", { "data-id": r.rollout_id },
      el("td", { text: r.run_id }), el("td", { class: "num", text: fmt(r.step) }),
      el("td", { class: "prompt", title: `${r.prompt_id}: ${r.prompt_text}`, text: r.prompt_text || r.prompt_id }),
      el("td", { class: "num", text: fmt(r.sample_index) }), el("td", { class: "num", text: fmt(r.reward) }),
      el("td", { class: r.verified === true ? "ok" : r.verified === false ? "bad" : "", text: fmt(r.verified) }),
      el("td", { text: r.finish_reason }), el("td", { class: "num", text: fmt(r.gen_tokens) }));
    tr.addEventListener("click", () => openRollout(r.rollout_id, tr));
    return tr;
  }));
  const last = Math.min(state.offset + state.limit, state.total);
  document.getElementById("page-info").textContent = state.total ? `${state.offset + 1}–${last} of ${state.total}` : "no rollouts match";
  document.getElementById("prev").disabled = state.offset === 0;
  document.getElementById("next").disabled = last >= state.total;
  const note = document.getElementById("search-note");
  note.hidden = data.search !== "scan";
  note.textContent = data.search === "scan" ? "searched row by row: this store has no text index (`gfcr store index STORE` builds it)" : "";
  loadHistograms();
  runLineageLink();
}

function runLineageLink() {
  // with a run chosen: what trained its checkpoint after the chosen step (the slider's, else the step
  // filter's upper bound, else the run's last step)
  const a = document.getElementById("run-lineage");
  const run = state.runs.find((r) => r.run_id === document.getElementById("f-run").value);
  if (!run) { a.hidden = true; return; }
  const one = document.getElementById("f-step-on").checked, smax = document.getElementById("f-step-max").value;
  const step = one ? Number(document.getElementById("f-step").value) : smax !== "" ? Math.min(Number(smax), run.step_max) : run.step_max;
  a.href = lineageHref(run.run_id, step);
  a.textContent = `what trained ${run.run_id}'s checkpoint after step ${step}`;
  a.hidden = false;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}
// field, label, and the two filter inputs a bar's click fills
const HISTS = [["reward", "reward", "f-reward-min", "f-reward-max"], ["gen", "gen tokens", "f-gen-min", "f-gen-max"]];

async function loadHistograms() {
  // the listed rows' reward and length, binned; a click on a bar sets that range's filter (and the URL)
  const seq = (state.histSeq = (state.histSeq || 0) + 1);
  const p = filterParams();
  p.delete("sort"); p.delete("order");
  for (const [field, label, minId, maxId] of HISTS) {
    const box = document.getElementById(`hist-${field}`);
    let h;
    try { h = await getJSON(`/api/histogram?field=${field}&${p}`); }
    catch (e) { if (seq === state.histSeq) box.replaceChildren(el("figcaption", { class: "muted", text: `${label}: ${e.message}` })); continue; }
    if (seq !== state.histSeq) return;  // a newer list asked already
    box.replaceChildren(histNode(h, label, minId, maxId));
  }
}

function histNode(h, label, minId, maxId) {
  const cap = el("figcaption", { class: "muted", text: `${label} of the ${h.n} listed rollouts` + (h.missing ? ` (${h.missing} without a value)` : "") +
    (h.bars.length ? " — click a bar to list it" : "") });
  if (!h.bars.length) return cap;
  const top = Math.max(...h.bars.map((b) => b.count)) || 1;
  const w = 100 / h.bars.length;
  const lo = document.getElementById(minId).value, hi = document.getElementById(maxId).value;
  const chart = svg("svg", { viewBox: "0 0 100 48", preserveAspectRatio: "none", "data-field": h.field, role: "img" });
  h.bars.forEach((b, i) => {
    const ht = b.count ? Math.max(1.5, (46 * b.count) / top) : 1;
    const range = b.count ? (b.min === b.max ? fmt(b.min) : `${fmt(b.min)}–${fmt(b.max)}`) : `${fmt(b.lo)}–${fmt(b.hi)}`;
    const on = b.count && lo === String(b.min) && hi === String(b.max);
    const r = svg("rect", { class: "bar" + (b.count ? "" : " empty") + (on ? " on" : ""), x: String(i * w + 0.3), y: String(48 - ht),
      width: String(Math.max(0.4, w - 0.6)), height: String(ht), "data-i": String(i), "data-count": String(b.count) },
    svg("title", {}, `${label} ${range}: ${b.count} rollout${b.count === 1 ? "" : "s"}${on ? " (click again: clear this filter)" : ""}`));
    if (b.count) r.addEventListener("click", () => {
      // a bar's range becomes the filter; a click on the chosen bar clears it
      document.getElementById(minId).value = on ? "" : String(b.min);
      document.getElementById(maxId).value = on ? "" : String(b.max);
      state.offset = 0; loadList();
    });
    chart.append(r);
  });
  const axis = el("div", { class: "axis" }, el("span", { text: fmt(h.bars[0].lo) }), el("span", { text: fmt(h.bars[h.bars.length - 1].hi) }));
  return el("div", {}, cap, chart, axis);
}

async function loadPaired() {
  // the run filter (A) and the compared run (B), paired per prompt: the verified rate of each, the mean
  // difference with its bootstrap interval, and the prompts where they differ (a click lists that prompt)
  const box = document.getElementById("paired");
  const a = document.getElementById("f-run").value, b = document.getElementById("f-run-b").value;
  if (!a || !b || a === b) { box.hidden = true; box.replaceChildren(); return; }
  let d;
  try { d = await getJSON(`/api/paired?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`); }
  catch (e) { box.hidden = false; box.replaceChildren(el("p", { class: "muted", text: e.message })); return; }
  if (!d.n) { box.hidden = false; box.replaceChildren(el("p", { id: "paired-summary", class: "muted", text: d.note })); return; }
  const sig = d.p_value < 0.05 ? "significant" : "not significant";
  const head = el("p", { id: "paired-summary", text: `${d.a} − ${d.b}, verified rate per prompt: ${d.diff >= 0 ? "+" : ""}${d.diff.toFixed(3)} ` +
    `[${d.ci[0].toFixed(3)}, ${d.ci[1].toFixed(3)}] over ${d.n} prompts, p = ${d.p_value.toPrecision(2)} (${d.test}): ${sig}; ` +
    `better in ${d.a} on ${d.a_better}, in ${d.b} on ${d.b_better}` });
  const rows = d.rows.filter((r) => r.diff !== 0).map((r) => {
    const btn = el("button", { type: "button", class: "paired-prompt", "data-prompt": r.prompt_id, text: r.prompt_id });
    btn.addEventListener("click", () => { document.getElementById("f-prompt").value = r.prompt_id; state.offset = 0; loadList(); });
    return el("tr", { "data-prompt": r.prompt_id }, el("td", {}, btn), el("td", { class: "num", text: `${r.a[0]}/${r.a[1]}` }),
      el("td", { class: "num", text: `${r.b[0]}/${r.b[1]}` }), el("td", { class: r.diff > 0 ? "ok num" : "bad num", text: (r.diff > 0 ? "+" : "") + r.diff.toFixed(3) }));
  });
  const table = el("table", { id: "paired-table" }, el("thead", {}, el("tr", {}, el("th", { text: "prompt (click: list it)" }),
    el("th", { text: `${d.a} verified` }), el("th", { text: `${d.b} verified` }), el("th", { text: "difference" }))), el("tbody", {}, ...rows));
  box.hidden = false;
  box.replaceChildren(head, rows.length ? table : el("p", { class: "muted", text: "the two runs agree on every shared prompt" }));
}

function sliderBounds() {
  // the step slider spans the selected run's steps (all runs' when none is selected)
  const sel = document.getElementById("f-run").value;
  const runs = state.runs.filter((r) => !sel || r.run_id === sel);
  const sl = document.getElementById("f-step");
  if (!runs.length) { sl.disabled = true; return; }
  sl.min = String(Math.min(...runs.map((r) => r.step_min)));
  sl.max = String(Math.max(...runs.map((r) => r.step_max)));
  if (Number(sl.value) < Number(sl.min) || Number(sl.value) > Number(sl.max)) sl.value = sl.min;
  sl.disabled = false;
  document.getElementById("f-step-value").textContent = document.getElementById("f-step-on").checked ? `step ${sl.value}` : "off";
}

function segmentsNode(segs) {
  const pre = el("pre", { class: "assistant" });
  for (const s of segs) {
    if (s.kind === "excluded") pre.append(el("span", { class: `seg-excluded cat-${s.category}`, "data-category": s.category, title: `excluded: ${s.category}`, text: s.text }));
    else if (s.kind === "supervised") pre.append(el("span", { class: "seg-supervised", title: "supervised", text: s.text }));
    else pre.append(document.createTextNode(s.text));
  }
  return pre;
}

function tokenText(piece) {
  // whitespace made visible, so a token strip can wrap without losing where lines and spaces were
  return piece.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/^ /, "·").replace(/ $/, "·") || "∅";
}

function bucket(v, lo, hi) {
  // a value's shade: 0..7 over [lo, hi]
  if (hi <= lo) return 4;
  return Math.max(0, Math.min(7, Math.floor(((v - lo) / (hi - lo)) * 8)));
}

function overlayRange(name, vals) {
  const xs = vals.filter((v) => v !== null && v !== undefined);
  if (!xs.length) return [0, 0];
  if (name === "gap" || name === "advantage") { const m = Math.max(...xs.map(Math.abs)) || 1; return [-m, m]; }
  return [Math.min(...xs), Math.max(...xs)];
}

function tokensNode(d, audit, overlay) {
  const kept = audit && audit.status === "kept";
  const ov = d.overlays || {};
  const vals = overlay === "role" ? null : ov[overlay];
  const legend = el("div", { class: "legend", "data-overlay": overlay }, el("span", { class: "tok tok-ctx", text: "context" }));
  if (overlay === "role") {
    if (kept) legend.append(el("span", { class: "tok tok-gen tok-sup", text: "generated, supervised" }),
      el("span", { class: "tok tok-gen tok-unsup", text: "generated, excluded from supervision" }));
    else legend.append(el("span", { class: "tok tok-gen", text: "generated (no kept audit)" }));
  } else if (overlay === "ross_mask" || overlay === "loss_mask") {
    legend.append(el("span", { class: "tok ov-in", text: overlay === "loss_mask" ? "in the loss" : "supervised" }),
      el("span", { class: "tok ov-out", text: overlay === "loss_mask" ? "not in the loss" : "excluded (no category)" }));
    if (overlay === "ross_mask") for (const c of CATEGORIES) legend.append(el("span", { class: `tok cat-${c}`, text: c }));
  } else if (vals) {
    const [lo, hi] = overlayRange(overlay, vals);
    legend.append(el("span", { class: "tok ov-b0", text: fmt(lo) }), el("span", { class: "tok ov-b4", text: "…" }),
      el("span", { class: "tok ov-b7", text: fmt(hi) }));
  }
  const note = (ov.notes && ov.notes[overlay]) || (overlay !== "role" && !vals ? "not stored for this rollout" : null);
  const box = el("div", { class: "tokens", id: "token-strip" });
  const [lo, hi] = vals ? overlayRange(overlay, vals) : [0, 0];
  for (const t of d.tokens) {
    let cls = t.role === 1 ? "tok tok-gen" : "tok tok-ctx";
    let what = t.role === 1 ? (kept ? (audit.mask[t.i] === 0 ? "generated, excluded" : "generated, supervised") : "generated") : "context";
    if (overlay === "role") {
      if (kept && t.role === 1) cls += audit.mask[t.i] === 0 ? " tok-unsup" : " tok-sup";
    } else if (vals && overlay === "ross_mask") {
      const cat = ov.ross_category ? ov.ross_category[t.i] : null;
      if (t.role === 1) cls = "tok " + (vals[t.i] === 1 ? "ov-in" : cat && cat !== "excluded" ? `cat-${cat} tok-unsup` : "ov-out");
      what = t.role === 1 ? (vals[t.i] === 1 ? "supervised" : `excluded: ${cat || "excluded"}`) : "context";
      if (cat) cls += " ov-excl";
    } else if (vals && overlay === "loss_mask") {
      cls = "tok " + (vals[t.i] === 1 ? "ov-in" : "ov-out");
      what = vals[t.i] === 1 ? "in the loss" : "not in the loss";
    } else if (vals && vals[t.i] !== null && vals[t.i] !== undefined) {
      cls = `tok ov-v ov-b${bucket(vals[t.i], lo, hi)}`;
      what = `${overlay} ${fmt(vals[t.i])}`;
    }
    box.append(el("span", { class: cls, "data-i": String(t.i), title: `#${t.i} · id ${t.id} · ${what}`, text: d.decoded ? tokenText(t.text) : String(t.id) }));
  }
  if (d.tokens_truncated) box.append(el("span", { class: "muted", text: ` … (first ${d.tokens.length} of ${d.n_tokens})` }));
  const tnote = d.decoded ? null : el("p", { class: "note warn", text: (d.tokenizer && d.tokenizer.note) || "tokens shown as ids" });
  const picker = el("div", { class: "overlay-picker" }, el("span", { class: "muted", text: "overlay: " }));
  for (const [k, label] of OVERLAYS) {
    const b = el("button", { type: "button", class: k === overlay ? "ov-btn on" : "ov-btn", "data-overlay": k, text: label });
    if (k !== "role" && !ov[k]) b.disabled = true;
    picker.append(b);
  }
  return el("div", { class: "token-view" }, picker, legend, note ? el("p", { class: "muted ov-note", text: note }) : null, tnote, box);
}

function siblingsNode(d) {
  const tbody = el("tbody");
  for (const s of d.siblings) {
    const self = s.rollout_id === d.rollout_id;
    const link = self ? el("b", { text: `#${s.sample_index} (this one)` })
      : el("a", { href: `#rollout=${encodeURIComponent(s.rollout_id)}`, class: "sibling", "data-id": s.rollout_id, text: `#${s.sample_index}` });
    tbody.append(el("tr", { class: self ? "selected" : "" }, el("td", {}, link), el("td", { class: "num", text: fmt(s.reward) }),
      el("td", { class: s.verified === true ? "ok" : s.verified === false ? "bad" : "", text: fmt(s.verified) }),
      el("td", { text: s.finish_reason })));
  }
  return el("table", { id: "siblings" }, el("thead", {}, el("tr", {}, el("th", { text: "sample" }), el("th", { text: "reward" }),
    el("th", { text: "verified" }), el("th", { text: "finish" }))), tbody);
}

function hashId() {
  const m = location.hash.match(/^#rollout=(.+)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

function hashLineage() {
  // #lineage=RUN@STEP: the checkpoint saved after STEP of RUN
  const m = location.hash.match(/^#lineage=(.+)@(\d+)$/);
  return m ? [decodeURIComponent(m[1]), Number(m[2])] : null;
}
const lineageHref = (run, step) => `#lineage=${encodeURIComponent(run)}@${step}`;

async function openLineage(run, step) {
  // which stored rollouts trained the checkpoint after `step` of `run` (`gfcr store lineage`'s query)
  const pane = document.getElementById("detail-pane");
  pane.className = "";
  let d;
  try { d = await getJSON(`/api/lineage?run=${encodeURIComponent(run)}&step=${step}`); }
  catch (e) { pane.replaceChildren(el("p", { class: "err", text: e.message })); return; }
  state.shown = null;
  const steps = el("tbody");
  for (const s of d.per_step) steps.append(el("tr", {}, el("td", {}, el("a", { href: lineageHref(d.run, s.step), text: String(s.step) })),
    el("td", { class: "num", text: String(s.fresh) }), el("td", { class: "num", text: String(s.replayed) })));
  const used = el("tbody");
  for (const u of d.used) used.append(el("tr", { "data-id": u.rollout_id },
    el("td", {}, el("a", { href: `#rollout=${encodeURIComponent(u.rollout_id)}`, class: "lineage-rollout", "data-id": u.rollout_id, text: u.rollout_id })),
    el("td", { class: "num", text: String(u.step) }), el("td", { text: u.trained_at.join(", ") }),
    el("td", { text: u.fresh ? (u.replayed.length ? "fresh + replayed" : "fresh") : "replayed" }),
    el("td", { text: u.prompt_id }), el("td", { class: "num", text: fmt(u.reward) }),
    el("td", { class: u.verified === true ? "ok" : u.verified === false ? "bad" : "", text: fmt(u.verified) })));
  const head = (...names) => el("thead", {}, el("tr", {}, ...names.map((n) => el("th", { text: n }))));
  pane.replaceChildren(el("div", { id: "lineage", "data-run": d.run, "data-step": String(d.step) },
    el("h2", { text: `What trained ${d.run}'s checkpoint after step ${d.step}` }),
    el("p", { id: "lineage-summary", text: `${d.n_used} rollouts: ${d.fresh_uses} fresh uses and ${d.replayed_uses} replayed uses over ` +
      `${d.per_step.length} training steps` + (d.unknown ? `; ${d.unknown} rows do not record whether they were trained` : "") }),
    el("h2", { text: "Uses per training step (a step: what trained the checkpoint after it)" }),
    el("table", { id: "lineage-steps" }, head("step", "fresh", "replayed"), steps),
    el("h2", { text: `Rollouts (${d.used.length}${d.truncated ? ` of ${d.n_used}` : ""}; a click opens one)` }),
    el("table", { id: "lineage-rollouts" }, head("rollout", "generated at", "trained at", "use", "prompt", "reward", "verified"), used)));
}

async function compareWith(d) {
  // the same prompt at the same step in the other run, else that run's first rollout at the step
  const runB = document.getElementById("f-run-b").value;
  if (!runB || runB === d.run_id) return null;
  const base = `/api/rollouts?run=${encodeURIComponent(runB)}&step_min=${d.step}&step_max=${d.step}&limit=1`;
  let hit = await getJSON(base + `&prompt=${encodeURIComponent(d.prompt_id)}`);
  if (!hit.items.length) hit = await getJSON(base);
  if (!hit.items.length) return { missing: `run ${runB} has no rollout at step ${d.step}` };
  return getJSON("/api/rollouts/" + encodeURIComponent(hit.items[0].rollout_id) + judgeParam());
}

function detailNode(d, side) {
  const col = el("div", { class: "detail-col", "data-side": side, "data-id": d.rollout_id });
  col.append(...detailNodes(d));
  return col;
}

async function openRollout(id, tr) {
  const pane = document.getElementById("detail-pane");
  document.querySelectorAll("#rollouts tr.selected").forEach((x) => x.classList.remove("selected"));
  if (tr) tr.classList.add("selected");
  if (!tr) { const row = document.querySelector(`#rollouts tr[data-id="${CSS.escape(id)}"]`); if (row) row.classList.add("selected"); }
  let d, other;
  try { d = await getJSON("/api/rollouts/" + encodeURIComponent(id) + judgeParam()); other = await compareWith(d); }
  catch (e) { pane.replaceChildren(el("p", { class: "err", text: e.message })); return; }
  if (location.hash !== `#rollout=${encodeURIComponent(id)}`) history.replaceState(null, "", `#rollout=${encodeURIComponent(id)}`);
  state.shown = [d, other];
  renderDetail();
}

function renderDetail() {
  const pane = document.getElementById("detail-pane");
  const [d, other] = state.shown || [];
  if (!d) return;
  if (!other) { pane.className = ""; pane.replaceChildren(...detailNodes(d)); return; }
  pane.className = "compare";
  pane.replaceChildren(detailNode(d, "a"), other.missing ? el("div", { class: "detail-col", "data-side": "b" },
    el("p", { class: "muted", text: other.missing })) : detailNode(other, "b"));
}

function detailNodes(d) {
  const audit = d.audit;
  const nodes = [
    el("h2", { text: `Rollout ${d.rollout_id}` }),
    el("div", { class: "muted", text: `run ${d.run_id} · step ${d.step} · prompt ${d.prompt_id} · sample ${d.sample_index} · task ${d.task} · policy ${d.policy_version}` }),
    el("a", { class: "lineage-link", href: lineageHref(d.run_id, d.step), text: `what trained the checkpoint after step ${d.step} of ${d.run_id} (lineage)` }),
    el("div", { id: "scores", text: `reward ${fmt(d.reward)} · verified ${fmt(d.verified)} · finish ${d.finish_reason} · tokens: ${d.n_context} context / ${d.n_generated} generated` }),
    el("h2", { text: `Group ${d.group_id} (${d.siblings.length} sample${d.siblings.length === 1 ? "" : "s"})` }),
    siblingsNode(d),
    el("h2", { text: "Turns" }),
  ];
  for (const m of d.messages) {
    if (m.role === "assistant") continue;
    nodes.push(el("div", { class: "turn" }, el("div", { class: "role", text: m.role }), el("pre", { text: m.content })));
  }
  const legend = el("div", { class: "legend" }, el("span", { class: "seg-supervised", text: "supervised" }));
  for (const c of ["corrected_mistake", "redundant_exploration", "abandoned_attempt", "incorrect_claim", "other"]) legend.append(el("span", { class: `cat-${c}`, text: c }));
  const label = audit ? `audit ${audit.judge}@${audit.judge_version}: ${audit.status}${audit.ter === null || audit.ter === undefined ? "" : " · TER " + fmt(audit.ter)}`
    : d.judge ? `not audited by ${d.judge}` : "not audited";
  nodes.push(el("div", { class: "turn", id: "assistant-turn", "data-judge": d.judge || "" }, el("div", { class: "role", text: "assistant" }),
    el("div", { class: "muted", id: "audit-label", text: label }), legend,
    segmentsNode(audit && audit.status === "kept" ? audit.segments : d.segments)));
  nodes.push(el("h2", { text: `ROSS audits (${d.audits.length})` }));
  if (!d.audits.length) nodes.push(el("p", { class: "muted", id: "no-audit", text: "not audited" }));
  for (const a of d.audits) {
    const ul = el("ul");
    for (const s of a.excluded) ul.append(el("li", {}, el("span", { class: `cat-${s.category}`, text: s.category }), ` [${s.start}, ${s.end}) `, el("code", { text: s.quote || "" })));
    nodes.push(el("div", { class: a.shown ? "audit shown" : "audit", "data-judge": a.judge },
      el("b", { text: `${a.judge}@${a.judge_version}: ${a.status}${a.shown ? " (shown)" : ""}` }),
      el("span", { class: "muted", text: ` TER ${fmt(a.ter)} · ${a.supervised_tokens} supervised tokens${a.reason ? " · " + a.reason : ""}` }), ul));
  }
  nodes.push(el("h2", { text: `Tokens (${d.n_context} context, ${d.n_generated} generated)` }), tokensNode(d, audit, state.overlay));
  nodes.push(el("h2", { text: "Verifier evidence" }), el("pre", { id: "verifier", text: JSON.stringify(d.verifier, null, 1) }));
  nodes.push(el("h2", { text: "Signals" }), el("pre", { text: JSON.stringify(d.signals, null, 1) }));
  return nodes;
}

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("filters").addEventListener("submit", (ev) => { ev.preventDefault(); state.offset = 0; loadList(); });
  document.getElementById("f-limit").addEventListener("change", (ev) => { state.limit = Number(ev.target.value); state.offset = 0; loadList(); });
  for (const id of ["f-sort", "f-order", "f-audit", "f-task", "f-finish", "f-verified"]) {
    document.getElementById(id).addEventListener("change", () => { state.offset = 0; loadList(); });
  }
  document.querySelector("#rollouts thead").addEventListener("click", (ev) => {
    // a column header sorts by it; a second click reverses the order
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    const sort = document.getElementById("f-sort"), order = document.getElementById("f-order");
    if (sort.value === th.dataset.sort) order.value = order.value === "asc" ? "desc" : "asc";
    else { sort.value = th.dataset.sort; order.value = th.dataset.sort === "reward" || th.dataset.sort === "gen" ? "desc" : "asc"; }
    state.offset = 0; loadList();
  });
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadList(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; loadList(); });
  document.getElementById("detail-pane").addEventListener("click", (ev) => {
    const a = ev.target.closest("a.sibling, a.lineage-rollout");
    if (a) { ev.preventDefault(); openRollout(a.dataset.id, null); return; }
    const b = ev.target.closest("button.ov-btn");
    if (b && !b.disabled) { state.overlay = b.dataset.overlay; renderDetail(); }
  });
  const slider = document.getElementById("f-step");
  slider.addEventListener("input", () => {
    document.getElementById("f-step-on").checked = true;
    sliderBounds(); state.offset = 0; loadList();
  });
  document.getElementById("f-step-on").addEventListener("change", () => { sliderBounds(); state.offset = 0; loadList(); });
  document.getElementById("f-run").addEventListener("change", () => sliderBounds());
  document.getElementById("f-judge").addEventListener("change", (ev) => {
    state.judge = ev.target.value;
    saveUrl();
    loadRoss();
    if (document.getElementById("f-audit").value) { state.offset = 0; loadList(); }
    if (state.shown && state.shown[0]) openRollout(state.shown[0].rollout_id, null);
  });
  document.getElementById("f-run-b").addEventListener("change", () => { saveUrl(); loadPaired(); if (state.shown && state.shown[0]) openRollout(state.shown[0].rollout_id, null); });
  document.getElementById("f-run").addEventListener("change", () => loadPaired());
  window.addEventListener("hashchange", () => {
    const id = hashId(), lin = hashLineage();
    if (id) openRollout(id, null);
    else if (lin) openLineage(...lin);
  });
  try { await loadSummary(); } catch (e) { document.getElementById("store").textContent = e.message; }
  restoreUrl();
  await loadList();
  loadPaired();
  const id = hashId(), lin = hashLineage();
  if (id) openRollout(id, null);
  else if (lin) openLineage(...lin);
});
