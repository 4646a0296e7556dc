// gfcr viewer: every string from the store is inserted with textContent, never as HTML.
"use strict";
const state = { offset: 0, limit: 25, total: 0, selected: null };

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

function query() {
  const p = new URLSearchParams();
  for (const inp of document.querySelectorAll("#filters [name]")) if (inp.value !== "") p.set(inp.name, inp.value);
  p.set("offset", state.offset); p.set("limit", state.limit);
  return p;
}

async function loadSummary() {
  const s = await getJSON("/api/summary");
  document.getElementById("store").textContent = s.store;
  const t = s.tokenizer || {};
  const tk = document.getElementById("tokenizer");
  tk.textContent = t.note ? t.note : `tokens decoded with ${t.name}${t.source === "store" ? " (the store's model)" : ""}`;
  tk.className = t.note ? "note warn" : "note";
  const run = document.getElementById("f-run");
  for (const r of s.runs) run.append(el("option", { value: r.run_id, text: `${r.run_id} (${r.rollouts})` }));
  const fin = document.getElementById("f-finish");
  for (const f of s.finish_reasons) fin.append(el("option", { value: f, text: f }));
}

async function loadList() {
  const body = document.querySelector("#rollouts tbody");
  let data;
  try { data = await getJSON("/api/rollouts?" + query()); }
  catch (e) { body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "err", text: e.message }))); return; }
  state.total = data.total;
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

function tokensNode(d, audit) {
  const kept = audit && audit.status === "kept";
  const legend = el("div", { class: "legend" }, el("span", { class: "tok tok-ctx", text: "context" }));
  if (kept) legend.append(el("span", { class: "tok tok-gen tok-sup", text: "generated, supervised" }),
    el("span", { class: "tok tok-gen tok-unsup", text: "generated, excluded from supervision" }));
  else legend.append(el("span", { class: "tok tok-gen", text: "generated (no kept audit)" }));
  const box = el("div", { class: "tokens", id: "token-strip" });
  for (const t of d.tokens) {
    let cls = t.role === 1 ? "tok tok-gen" : "tok tok-ctx";
    if (kept && t.role === 1) cls += audit.mask[t.i] === 0 ? " tok-unsup" : " tok-sup";
    const what = t.role === 1 ? (kept ? (audit.mask[t.i] === 0 ? "generated, excluded" : "generated, supervised") : "generated") : "context";
    box.append(el("span", { class: cls, title: `#${t.i} · id ${t.id} · ${what}`, text: d.decoded ? tokenText(t.text) : String(t.id) }));
  }
  if (d.tokens_truncated) box.append(el("span", { class: "muted", text: ` … (first ${d.tokens.length} of ${d.n_tokens})` }));
  const note = d.decoded ? null : el("p", { class: "note warn", text: (d.tokenizer && d.tokenizer.note) || "tokens shown as ids" });
  return el("div", {}, legend, note, box);
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

async function openRollout(id, tr) {
  const pane = document.getElementById("detail-pane");
  document.querySelectorAll("#rollouts tr.selected").forEach((x) => x.classList.remove("selected"));
  if (tr) tr.classList.add("selected");
  if (!tr) { const row = document.querySelector(`#rollouts tr[data-id="${CSS.escape(id)}"]`); if (row) row.classList.add("selected"); }
  let d;
  try { d = await getJSON("/api/rollouts/" + encodeURIComponent(id)); }
  catch (e) { pane.replaceChildren(el("p", { class: "err", text: e.message })); return; }
  if (location.hash !== `#rollout=${encodeURIComponent(id)}`) history.replaceState(null, "", `#rollout=${encodeURIComponent(id)}`);
  const audit = d.audits.length ? d.audits[d.audits.length - 1] : null;
  const nodes = [
    el("h2", { text: `Rollout ${d.rollout_id}` }),
    el("div", { class: "muted", text: `run ${d.run_id} · step ${d.step} · prompt ${d.prompt_id} · sample ${d.sample_index} · task ${d.task} · policy ${d.policy_version}` }),
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
  nodes.push(el("div", { class: "turn", id: "assistant-turn" }, el("div", { class: "role", text: "assistant" }), legend,
    segmentsNode(audit && audit.status === "kept" ? audit.segments : d.segments)));
  nodes.push(el("h2", { text: `ROSS audits (${d.audits.length})` }));
  if (!d.audits.length) nodes.push(el("p", { class: "muted", id: "no-audit", text: "not audited" }));
  for (const a of d.audits) {
    const ul = el("ul");
    for (const s of a.excluded) ul.append(el("li", {}, el("span", { class: `cat-${s.category}`, text: s.category }), ` [${s.start}, ${s.end}) `, el("code", { text: s.quote || "" })));
    nodes.push(el("div", { class: "audit" }, el("b", { text: `${a.judge}@${a.judge_version}: ${a.status}` }),
      el("span", { class: "muted", text: ` TER ${fmt(a.ter)} · ${a.supervised_tokens} supervised tokens${a.reason ? " · " + a.reason : ""}` }), ul));
  }
  nodes.push(el("h2", { text: `Tokens (${d.n_context} context, ${d.n_generated} generated)` }), tokensNode(d, audit));
  nodes.push(el("h2", { text: "Verifier evidence" }), el("pre", { id: "verifier", text: JSON.stringify(d.verifier, null, 1) }));
  nodes.push(el("h2", { text: "Signals" }), el("pre", { text: JSON.stringify(d.signals, null, 1) }));
  pane.replaceChildren(...nodes);
}

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("filters").addEventListener("submit", (ev) => { ev.preventDefault(); state.offset = 0; loadList(); });
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadList(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; loadList(); });
  document.getElementById("detail-pane").addEventListener("click", (ev) => {
    const a = ev.target.closest("a.sibling");
    if (a) { ev.preventDefault(); openRollout(a.dataset.id, null); }
  });
  window.addEventListener("hashchange", () => { const id = hashId(); if (id) openRollout(id, null); });
  try { await loadSummary(); } catch (e) { document.getElementById("store").textContent = e.message; }
  await loadList();
  const id = hashId();
  if (id) openRollout(id, null);
});
