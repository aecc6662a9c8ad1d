// The run console: a runs list and a run page with its live timeline, over the service API.
// No build step and no dependencies: the API key stays in this tab (sessionStorage) and goes in
// an Authorization header; events are read with fetch() as Server-Sent Events, so the header
// can be sent (EventSource cannot send one).
"use strict";

const KEY_STORE = "wesichain.key";
const STATUSES = ["queued", "running", "awaiting_approval", "completed", "failed", "interrupted"];
const TERMINAL = new Set(["completed", "failed", "interrupted"]);
const END_EVENTS = new Set(["Completed", "Failed", "Interrupted"]);
const PHASE_COLOURS = { start: "#4466cc", think: "#2a9fd6", observe: "#2fa860", decide: "#a04cc8", act: "#6b7385" };

const $ = (sel) => document.querySelector(sel);
let view = null; // the page being shown: {stop()} so leaving it ends its timers and streams

class Unauthorised extends Error {}

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.kind = err.kind || "http_error";
  }
}

// A read refused for a moment (429 too_many_scans, 503 while Redis restarts) is sent again after
// the Retry-After it names, a few times: a page refreshing as events come may overlap its own reads.
const READ_RETRIES = 4;
const MAX_RETRY_AFTER_S = 5;

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const read = (options.method || "GET").toUpperCase() === "GET";
  let response;
  for (let attempt = 0; ; attempt++) {
    response = await fetch(path, { ...options, headers, body: options.body === undefined ? undefined : JSON.stringify(options.body) });
    const wait = Number(response.headers.get("Retry-After"));
    if (!read || attempt >= READ_RETRIES || ![429, 503].includes(response.status) || !(wait > 0 && wait <= MAX_RETRY_AFTER_S)) break;
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    if (options.signal && options.signal.aborted) break;
  }
  if (response.status === 401) throw new Unauthorised();
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  return node;
}

const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
const seconds = (s) => (s < 1 ? `${(s * 1000).toFixed(0)} ms` : s < 120 ? `${s.toFixed(2)} s` : `${(s / 60).toFixed(1)} min`);
const short = (text, n = 140) => (text && text.length > n ? `${text.slice(0, n)}…` : text || "");

function show(section) {
  for (const id of ["login", "list-view", "run-view", "pipeline-view", "pipelines-view", "memory-view", "bulk-view", "operator-view", "assistants-view", "schedules-view"]) $(`#${id}`).hidden = id !== section;
}

function needKey(message) {
  if (view) view.stop();
  view = null;
  show("login");
  $("#login-error").textContent = message || "";
  $("#login-key").focus();
}

function handleError(err, where) {
  if (err instanceof Unauthorised) return needKey(sessionStorage.getItem(KEY_STORE) ? "That key was refused." : "");
  $(where).textContent = err.message;
}

// -- runs list ------------------------------------------------------------------------------

function listView() {
  show("list-view");
  let cursor = null;
  let stopped = false;
  const form = $("#filters");
  const params = () => {
    const q = new URLSearchParams();
    for (const name of ["agent", "status", "thread_id"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
    if (form.elements.since.value) q.set("since", String(Date.now() / 1000 - Number(form.elements.since.value)));
    return q;
  };
  const row = (run) =>
    el("tr", { "data-run": run.run_id },
      el("td", { class: "mono" }, el("a", { href: `#/runs/${run.run_id}` }, run.run_id.slice(0, 12))),
      el("td", {}, run.agent, familyOf(run)),
      el("td", {}, el("span", { class: `badge ${run.status}` }, run.status)),
      el("td", {}, `${run.step}`),
      el("td", {}, when(run.created_at)),
      el("td", {}, seconds(run.updated_at - run.created_at)),
      el("td", { class: "clip" }, run.error ? `${run.error.kind}: ${run.error.message}` : run.waiting_for || short(run.answer)));

  async function load(append) {
    const q = params();
    q.set("limit", "50");
    if (append && cursor) q.set("cursor", cursor);
    // Filters the listing does not have go through the search (POST /v1/runs/search).
    const query = searchQuery(form);
    const page = query.version || query.error_kind || query.metadata
      ? await api("/v1/runs/search", { method: "POST", body: { query, limit: 50, ...(append && cursor ? { cursor } : {}) } })
      : await api(`/v1/runs?${q}`);
    const body = $("#runs tbody");
    if (!append) body.replaceChildren();
    for (const run of page.runs) body.append(row(run));
    cursor = page.next_cursor;
    $("#more").hidden = !cursor;
    $("#list-error").textContent = "";
  }

  async function counts() {
    const box = $("#counts");
    const boxes = await Promise.all(STATUSES.map(async (status) => {
      const q = params();
      q.set("status", status);
      q.set("limit", "200");
      const page = await api(`/v1/runs?${q}`);
      const n = `${page.runs.length}${page.next_cursor ? "+" : ""}`;
      return el("span", { class: "count", "data-status": status, onclick: () => { form.elements.status.value = status; refresh(); } },
        el("b", {}, n), status.replace("_", " "));
    }));
    box.replaceChildren(...boxes);
  }

  // Agent versions live in the pool and this tenant's runs on each (GET /v1/versions).
  async function versions() {
    const listed = (await api("/v1/versions")).versions;
    $("#versions tbody").replaceChildren(...listed.map((v) =>
      el("tr", { "data-version": `${v.agent}:${v.version}` },
        el("td", {}, `${v.agent} v${v.version}`),
        el("td", {}, `${v.workers}`),
        el("td", {}, `${v.draining}`),
        el("td", {}, `${v.active_runs}`),
        el("td", {}, `${v.parked_runs}`),
        el("td", {}, v.waiting ? `waiting for a worker serving ${v.agent} v${v.version}` : v.workers ? "live" : "no workers"))));
  }

  async function refresh() {
    try {
      await Promise.all([load(false), counts(), versions()]);
    } catch (err) {
      handleError(err, "#list-error");
    }
  }

  form.onsubmit = (e) => { e.preventDefault(); refresh(); };
  $("#bulk-form").onsubmit = async (e) => {
    e.preventDefault();
    const bulk = $("#bulk-form").elements;
    try {
      await api("/v1/bulk", { method: "POST", body: { action: bulk.action.value, query: searchQuery(form), rate_per_s: Number(bulk.rate_per_s.value) } });
      location.hash = "#/bulk";
    } catch (err) { handleError(err, "#list-error"); }
  };
  // Every failed run the filters find, retried by a bulk job (fresh runs with the same requests).
  $("#retry-failed").onclick = async () => {
    try {
      await api("/v1/bulk", { method: "POST", body: { action: "retry", query: { ...searchQuery(form), status: "failed" }, rate_per_s: 5 } });
      location.hash = "#/bulk";
    } catch (err) { handleError(err, "#list-error"); }
  };
  $("#more").onclick = () => load(true).catch((err) => handleError(err, "#list-error"));
  refresh();
  // Live: the first page and the counts follow the runs (a later page stays as it was loaded).
  const timer = setInterval(() => { if (!stopped && !cursorPaged()) refresh(); }, 2000);
  const cursorPaged = () => $("#runs tbody").children.length > 50;
  return { stop() { stopped = true; clearInterval(timer); } };
}

// Which family a run belongs to, under its agent: a subagent's parent, a pipeline, an eval.
function familyOf(run) {
  if (run.parent) return el("div", { class: "family" }, "subagent of ", el("a", { href: `#/runs/${run.parent.run_id}` }, run.parent.run_id.slice(0, 12)));
  if (run.link && run.link.kind === "pipeline") return el("div", { class: "family" }, "in pipeline ", el("a", { href: `#/pipelines/${run.link.pipeline_id}` }, run.link.pipeline_id));
  if (run.link && run.link.kind === "eval") return el("div", { class: "family" }, "case of eval ",
    evalCaseHref(run.link) ? el("a", { href: evalCaseHref(run.link), class: "eval-link" }, run.link.eval_id) : run.link.eval_id);
  return "";
}

// The list's filters as a search query (POST /v1/runs/search, POST /v1/bulk); metadata is typed
// as "key=value, key=value".
function searchQuery(form) {
  const query = {};
  for (const name of ["agent", "status", "thread_id", "version", "error_kind"]) if (form.elements[name].value) query[name] = form.elements[name].value.trim();
  if (form.elements.since.value) query.since = Date.now() / 1000 - Number(form.elements.since.value);
  const pairs = form.elements.metadata.value.split(",").map((p) => p.trim()).filter(Boolean);
  if (pairs.length) query.metadata = Object.fromEntries(pairs.map((p) => [p.split("=")[0].trim(), p.slice(p.indexOf("=") + 1).trim()]));
  return query;
}

// -- bulk jobs: their progress, live while any runs ------------------------------------------

function bulkView() {
  show("bulk-view");
  let stopped = false;
  let timer = null;
  const describe = (q) => Object.entries(q).filter(([, v]) => v !== null && !(typeof v === "object" && !Object.keys(v).length))
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : k === "since" || k === "until" ? when(v) : v}`).join(" ");
  const stop = (job) => async () => {
    try {
      await api(`/v1/bulk/${job.job_id}/cancel`, { method: "POST" });
      refresh();
    } catch (err) { handleError(err, "#bulk-error"); }
  };
  async function refresh() {
    if (stopped) return;
    try {
      const { jobs } = await api("/v1/bulk");
      if (stopped) return;
      $("#bulk-jobs tbody").replaceChildren(...jobs.map((job) => el("tr", { "data-job": job.job_id },
        el("td", { class: "mono" }, job.job_id.slice(0, 12)),
        el("td", {}, job.action),
        el("td", {}, el("span", { class: `badge ${job.status === "done" ? "completed" : job.status === "cancelled" ? "interrupted" : "running"}` }, job.status)),
        el("td", {}, `${job.acted}`), el("td", {}, `${job.skipped}`), el("td", {}, `${job.failed}`),
        el("td", {}, when(job.created_at)),
        el("td", { class: "clip" }, describe(job.query)),
        el("td", {}, job.status === "running" ? el("button", { onclick: stop(job) }, "Stop") : ""))));
      $("#bulk-error").textContent = "";
      if (jobs.some((job) => job.status === "running")) timer = setTimeout(refresh, 1000);
    } catch (err) { handleError(err, "#bulk-error"); }
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

// -- schedules: next fire times, last runs (linking to their pages), pause and resume ---------

function schedulesView() {
  show("schedules-view");
  let stopped = false;
  let timer = null;
  const timing = (t) => (t.cron ? `cron ${t.cron} (${t.timezone})` : `every ${t.every_s} s`);
  const toggle = (s) => async () => {
    try {
      await api(`/v1/schedules/${encodeURIComponent(s.schedule_id)}/${s.paused ? "resume" : "pause"}`, { method: "POST" });
      refresh();
    } catch (err) { handleError(err, "#schedules-error"); }
  };
  const lastRuns = (ticks) => el("td", { class: "clip" }, ...ticks.slice(0, 5).map((t) => el("div", {},
    `${when(t.tick)} ${t.outcome} `,
    t.run_id ? el("a", { href: `#/runs/${encodeURIComponent(t.run_id)}`, class: "mono" }, t.run_id.slice(0, 14))
      : t.pipeline_id ? el("a", { href: `#/pipelines/${encodeURIComponent(t.pipeline_id)}`, class: "mono" }, t.pipeline_id)
      : short(t.reason, 60),
    t.status ? ` ${t.status}` : "")));
  async function refresh() {
    if (stopped) return;
    try {
      const { schedules } = await api("/v1/schedules");
      const rows = await Promise.all(schedules.map(async (s) => {
        const base = `/v1/schedules/${encodeURIComponent(s.schedule_id)}`;
        const [{ next_fire_times }, { runs }] = await Promise.all([api(`${base}/next?n=3`), api(`${base}/runs?limit=5`)]);
        return el("tr", { "data-schedule": s.schedule_id },
          el("td", { class: "mono" }, s.schedule_id.slice(0, 12)),
          el("td", {}, s.pipeline ? `pipeline ${s.pipeline}` : s.agent),
          el("td", {}, timing(s.timing), s.until ? el("div", {}, `until ${when(s.until)}`) : ""),
          el("td", {}, `${s.missed}${s.missed === "catch_up" ? ` ${s.catch_up}` : ""} / ${s.overlap}`),
          el("td", {}, el("span", { class: `badge ${s.paused || s.ended ? "interrupted" : "running"}` }, s.paused ? "paused" : s.ended ? "ended" : "active")),
          el("td", {}, ...next_fire_times.map((t) => el("div", {}, when(t)))),
          el("td", {}, `${s.started} / ${s.skipped} / ${s.missed_ticks} / ${s.failed}`),
          lastRuns(runs),
          el("td", {}, el("button", { onclick: toggle(s) }, s.paused ? "Resume" : "Pause")));
      }));
      if (stopped) return;
      $("#schedules-list tbody").replaceChildren(...rows);
      $("#schedules-error").textContent = "";
      timer = setTimeout(refresh, 2000);
    } catch (err) { handleError(err, "#schedules-error"); }
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

// -- run page: run.js (runView and its parts); the event stream it follows: ---------------------

// Server-Sent Events over fetch: resumes from the last id after a drop, ends after the end event.
async function follow(runId, signal, onEvent) {
  let lastId = null;
  for (let attempt = 0; attempt < 50 && !signal.aborted; attempt++) {
    const headers = { Accept: "text/event-stream" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = `Bearer ${key}`;
    if (lastId) headers["Last-Event-ID"] = lastId;
    let response;
    try {
      response = await fetch(`/v1/runs/${runId}/events`, { headers, signal });
    } catch (err) {
      if (signal.aborted) return;
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    if (response.status === 401) throw new Unauthorised();
    if (response.status === 204) return;
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (signal.aborted) return;
        break; // dropped: reconnect with Last-Event-ID
      }
      if (chunk.done) break;
      buffer += chunk.value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let id = null;
        const data = [];
        for (const line of frame.split("\n")) {
          if (line.startsWith("id:")) id = line.slice(3).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (!data.length) continue;
        if (id) lastId = id;
        const event = JSON.parse(data.join("\n"));
        onEvent(event);
        if (END_EVENTS.has(event.kind)) return;
      }
    }
  }
}

// -- the timeline as SVG ---------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawTimeline(box, t, ended) {
  const lanes = ["(queued)", ...t.lanes];
  const labelW = 170, laneH = 26, top = 22, right = 16;
  const width = Math.max(box.clientWidth || 900, 600);
  const end = ended ? t.end : Math.max(t.end, Date.now() / 1000);
  const span = Math.max(end - t.start, 1e-3);
  const x = (at) => labelW + ((at - t.start) / span) * (width - labelW - right);
  const y = (lane) => top + lanes.indexOf(lane) * laneH;
  const root = svg("svg", { width, height: top + lanes.length * laneH + 8, role: "img", "aria-label": `timeline of run ${t.run_id}` });
  const defs = svg("defs");
  const hatch = svg("pattern", { id: "lost", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
  hatch.append(svg("rect", { width: 3, height: 6, fill: "#d63a3a" }));
  defs.append(hatch);
  root.append(defs);
  for (let i = 0; i <= 5; i++) {
    const at = t.start + (span * i) / 5;
    root.append(svg("line", { x1: x(at), x2: x(at), y1: top - 4, y2: top + lanes.length * laneH, stroke: "#eef0f4" }));
    root.append(svg("text", { x: x(at), y: 12, class: "axis", "text-anchor": i === 5 ? "end" : i === 0 ? "start" : "middle" }, seconds(at - t.start)));
  }
  lanes.forEach((lane) => root.append(svg("text", { x: 6, y: y(lane) + 16, class: "lane-label" }, lane)));
  for (const w of t.waits) {
    // A wait a delivery died in is queue time plus that delivery's lost work, until its lease ran out.
    const line = svg("rect", { x: x(w.start), y: y("(queued)") + 11, width: Math.max(1, x(w.end) - x(w.start)), height: 4,
      fill: w.lost ? "url(#lost)" : "#c3c8d4", class: w.lost ? "wait lost" : "wait" });
    const died = w.lost ? `, ${w.lost} delivery(ies) died meanwhile` : "";
    line.append(svg("title", {}, `${w.name} (step ${w.step}) waited ${seconds(w.end - w.start)}${died}`));
    root.append(line);
  }
  for (const b of t.bars) {
    const endAt = b.kind === "running" ? end : b.end;
    const fill = b.kind === "tool" ? (b.ok ? "#e0a800" : "#d63a3a")
      : b.kind === "lost" ? "url(#lost)" : !b.ok ? "#d63a3a" : PHASE_COLOURS[b.name] || "#2a9fd6";
    const rect = svg("rect", {
      x: x(b.start), y: y(b.lane) + 4, width: Math.max(2, x(endAt) - x(b.start)), height: laneH - 8, rx: 2,
      fill, opacity: b.kind === "running" ? 0.55 : 1, class: `bar ${b.kind}`, "data-name": b.name,
    });
    const what = b.kind === "phase" ? b.name : `${b.kind} ${b.name}`;
    rect.append(svg("title", {}, `${what} · step ${b.step} · ${b.lane} · ${seconds(endAt - b.start)}${b.ref ? " · " + b.ref : ""}${b.detail ? " · " + b.detail : ""}${b.attempt > 1 ? " · attempt " + b.attempt : ""}`));
    root.append(rect);
  }
  for (const m of t.markers.filter((m) => m.kind === "takeover" && m.lane)) {
    const cx = x(m.at), cy = y(m.lane) + 2;
    const tri = svg("path", { d: `M${cx - 6},${cy} L${cx + 6},${cy} L${cx},${cy + 9} Z`, fill: "#d63a3a", class: "takeover" });
    tri.append(svg("title", {}, m.text));
    root.append(tri);
  }
  for (const m of t.markers.filter((m) => m.kind === "handoff")) {
    // A diamond on the lane that committed the handoff (on the first lane if none is known).
    const cx = x(m.at), cy = y(m.lane || lanes[0]) + laneH / 2;
    const mark = svg("path", { d: `M${cx},${cy - 7} L${cx + 7},${cy} L${cx},${cy + 7} L${cx - 7},${cy} Z`, fill: "#7a3fd6", class: "handoff" });
    mark.append(svg("title", {}, m.text));
    root.append(mark);
  }
  drawWorkerDeaths(root, t, x, y, top, top + lanes.length * laneH);
  box.replaceChildren(root);
}

// -- a pipeline run: its steps left to right, each child run a square linked to its own page --

const PIPELINE_ENDED = new Set(["completed", "failed", "cancelled"]);

function pipelineView(pipelineId) {
  show("pipeline-view");
  let stopped = false;
  let timer = null;
  $("#pipeline-title").textContent = `Pipeline run ${pipelineId}`;
  $("#pipeline-error").textContent = "";
  $("#pipeline-graph").replaceChildren();
  $("#pipeline-facts").replaceChildren();
  // The id is one path segment: a pipeline id may hold "/" and "..", which must not steer the
  // page's reads (and its cancel) to another resource.
  const path = `/v1/pipelines/${encodeURIComponent(pipelineId)}`;
  const cancel = $("#pipeline-cancel");
  cancel.hidden = true;
  cancel.onclick = async () => {
    try {
      await api(`${path}/cancel`, { method: "POST" });
      refresh();
    } catch (err) { handleError(err, "#pipeline-error"); }
  };
  async function refresh() {
    if (stopped) return;
    try {
      const p = await api(path);
      if (stopped) return;
      drawPipeline(p);
      cancel.hidden = PIPELINE_ENDED.has(p.status);
      if (!PIPELINE_ENDED.has(p.status)) timer = setTimeout(refresh, 1000);
    } catch (err) { handleError(err, "#pipeline-error"); }
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

function drawPipeline(p) {
  const status = $("#pipeline-status");
  status.textContent = p.status;
  status.className = `badge ${p.status === "cancelled" ? "interrupted" : p.status}`;
  const facts = [["Pipeline", p.name], ["Input", short(p.input, 400)], ["Created", when(p.created_at)]];
  if (p.finished_at) facts.push(["Took", seconds(p.finished_at - p.created_at)]);
  if (p.error) facts.push(["Error", `${p.error.kind}: ${p.error.message}`]);
  else if (p.output !== null && p.output !== undefined) {
    facts.push(["Output", short(typeof p.output === "string" ? p.output : JSON.stringify(p.output), 600)]);
  }
  $("#pipeline-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const boxes = [];
  for (const step of p.steps) {
    if (boxes.length) boxes.push(el("span", { class: "arrow" }, "→"));
    const via = step.via.map((v) => el("div", { class: "via" }, `${v.branch}: ${v.case} → ${v.to}`));
    const children = step.children.map((c) => {
      const square = el("span", { class: `child ${c.status}`, title: `item ${c.item}: ${c.status}${c.attempt ? ` (attempt ${c.attempt + 1})` : ""}` });
      return c.run_id ? el("a", { href: `#/runs/${c.run_id}`, "data-run": c.run_id }, square) : square;
    });
    boxes.push(el("div", { class: "step", "data-seq": step.seq, "data-kind": step.kind },
      ...via,
      el("div", { class: "kind" }, `${step.kind} · ${step.pipeline}`),
      el("div", {}, el("b", {}, step.name), step.agent ? ` (${step.agent})` : ""),
      el("div", { class: "done" }, `${step.done}/${step.total} done`),
      el("div", { class: "children" }, ...children)));
  }
  $("#pipeline-graph").replaceChildren(...boxes);
}

// -- long-term memory: the tenant's namespaces and the items a search finds, values as text ----

function memoryView() {
  show("memory-view");
  const form = $("#memory-form");
  const labels = (text) => text.split("/").filter((label) => label);
  async function search() {
    $("#memory-error").textContent = "";
    const prefix = labels(form.prefix.value);
    const query = form.query.value.trim() || null;
    try {
      const listed = await api("/v1/memory/namespaces", { method: "POST", body: { prefix } });
      const names = listed.namespaces.map((ns) => ns.join("/"));
      $("#memory-namespaces").textContent = names.length ? `Namespaces: ${names.join(", ")}` : "No items.";
      const found = await api("/v1/memory/items/search", { method: "POST", body: { namespace_prefix: prefix, query, limit: 100 } });
      $("#memory-items tbody").replaceChildren(...found.items.map((item) => el("tr", {},
        el("td", {}, item.namespace.join("/")),
        el("td", {}, item.key),
        el("td", {}, item.version),
        el("td", {}, when(item.updated_at)),
        el("td", {}, item.expires_at ? when(item.expires_at) : "never"),
        el("td", { class: "value" }, short(JSON.stringify(item.value), 400)))));
      $("#memory-note").textContent = found.truncated ? "The search stopped at its scan bound: narrow the prefix." : "";
    } catch (err) { handleError(err, "#memory-error"); }
  }
  form.onsubmit = (e) => { e.preventDefault(); search(); };
  search();
  return { stop() {} };
}

// -- routing ---------------------------------------------------------------------------------

// Bumped by every navigation: a route still waiting for its key check when the next one starts
// builds no view (two live views would draw into the same page).
let routing = 0;

// The run a #/runs/ID page names: linked as it is or percent-encoded, and only an id of the
// characters a run id may hold but '/' (letters, digits and . _ : @ -), so that it goes into the
// API's paths as one segment as it is.
function runOf(hash) {
  const linked = hash.match(/^#\/runs\/([^/?#]+)$/);
  if (!linked) return null;
  let id;
  try {
    id = decodeURIComponent(linked[1]);
  } catch {
    return null;
  }
  return /^[A-Za-z0-9_.:@-]+$/.test(id) ? id : null;
}

async function route() {
  const mine = ++routing;
  if (view) view.stop();
  view = null;
  // Nothing of the page left behind stays clickable while the next one loads: a button of the
  // previous run's (retry, fork) would act on that run.
  show(null);
  const runId = runOf(location.hash);
  try {
    const health = await api("/v1/whoami");
    if (mine !== routing) return;
    $("#whoami").textContent = health.tenant ? `tenant ${health.tenant}` : "no tenant (auth off)";
    $("#signout").hidden = !sessionStorage.getItem(KEY_STORE);
  } catch (err) {
    if (mine !== routing) return;
    if (err instanceof Unauthorised) return needKey(sessionStorage.getItem(KEY_STORE) ? "That key was refused." : "");
    $("#whoami").textContent = err.message;
  }
  const pipeline = location.hash.match(/^#\/pipelines\/([A-Za-z0-9_.:@\/-]+)$/);
  const bulk = location.hash === "#/bulk";
  if (location.hash === "#/schedules") view = schedulesView();
  else if (location.hash === "#/memory") view = memoryView();
  else if (location.hash === "#/pipelines") view = pipelinesView();
  else if (location.hash === "#/operator") view = operatorView();
  else if (location.hash === "#/assistants") view = assistantsView();
  else view = runId ? runView(runId) : pipeline ? pipelineView(pipeline[1]) : bulk ? bulkView() : listView();
}

$("#login-form").onsubmit = (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY_STORE, $("#login-key").value.trim());
  $("#login-key").value = "";
  route();
};
$("#signout").onclick = () => { sessionStorage.removeItem(KEY_STORE); route(); };
window.addEventListener("hashchange", route);
route();
