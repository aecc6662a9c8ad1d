// The operator view (#/operator): live workers, queue depths, leases, parked runs, runs ended per
// minute and dead workers, over GET /v1/pool, refreshed every two seconds. A tenant's key sees
// pool-wide counts and its own runs only (scope "tenant"); the answer says which.
// Everything from the API is rendered as text (el() makes text nodes), never as markup.
"use strict";

function operatorView() {
  show("operator-view");
  let stopped = false;
  let timer = null;
  const cell = (text, attrs = {}) => el("td", attrs, text);
  const depth = (d) => (d === null ? "unknown" : `${d}`);

  function render(pool) {
    $("#pool-scope").textContent = pool.scope === "operator"
      ? "Operator view: the whole pool."
      : "Tenant view: pool-wide counts and your own runs (an operator's key sees every worker).";
    const facts = [
      ["Workers", `${pool.worker_count} live, ${pool.consuming_workers} consuming`, "workers"],
      ["Slots", `${pool.slots_in_use} of ${pool.slots} in use`, "slots"],
      ["In flight", `${pool.in_flight}`, "in_flight"],
      ["Leases", pool.leases_due === null ? `${pool.leases}` : `${pool.leases} (${pool.leases_due} due)`, "leases"],
      ["Broker", pool.broker, "broker"],
    ];
    $("#pool-facts").replaceChildren(...facts.map(([name, value, key]) =>
      el("span", { class: "count", "data-fact": key }, el("b", {}, value), ` ${name}`)));
    $("#pool-workers tbody").replaceChildren(...pool.workers.map((w) =>
      el("tr", { "data-worker": w.id },
        cell(w.id, { class: "mono" }),
        cell(w.agents.join(", ")),
        cell(w.queues.join(", "), { class: "mono" }),
        cell(`${w.pool} ×${w.concurrency}`),
        cell(`${w.busy}/${w.concurrency}`, { "data-slots": "" }),
        cell(`${w.consumer_state}${w.draining ? " (draining)" : ""}`),
        cell(`${w.heartbeat_age_s.toFixed(1)} s ago`))));
    $("#pool-workers-note").textContent = pool.scope === "operator" ? (pool.workers.length ? "" : "No live worker.") : "";
    $("#pool-workers").hidden = pool.scope !== "operator";
    $("#pool-queues tbody").replaceChildren(...pool.queues.map((q) =>
      el("tr", { "data-queue": q.queue }, cell(q.queue, { class: "mono" }), cell(depth(q.depth), { "data-depth": "" }))));
    const p = pool.parked;
    const parked = [["approval", p.approval, "awaiting a decision"], ["subagents", p.subagents, "of those, waiting for subagents"],
      ["thread", p.thread, "behind their thread's previous run"], ["version", p.version, "waiting for a worker of their version"]];
    $("#pool-parked").replaceChildren(...parked.map(([kind, n, what]) =>
      el("span", { class: "count", "data-parked": kind }, el("b", {}, `${n}`), ` ${what}`)));
    $("#pool-parked-note").textContent = p.partial ? "Counted over a bounded number of runs and threads: there may be more." : "";
    $("#pool-running tbody").replaceChildren(...pool.running.map((r) =>
      el("tr", { "data-run": r.run_id },
        el("td", { class: "mono" }, el("a", { href: `#/runs/${r.run_id}` }, r.run_id.slice(0, 12))),
        cell(r.agent), el("td", {}, el("span", { class: `badge ${r.status}` }, r.status)),
        cell(r.lease_due_in_s === null ? "" : `${r.lease_due_in_s.toFixed(1)} s`))));
    $("#pool-deaths").replaceChildren(...pool.deaths.map((d) =>
      el("li", { "data-death": d.worker }, el("span", { class: "mono" }, d.worker), ` died ${when(d.at)}: ${d.claims} claim(s) handed on`)));
    $("#pool-deaths-box").hidden = pool.scope !== "operator";
    drawThroughput($("#pool-throughput"), pool.throughput);
  }

  async function refresh() {
    if (stopped) return;
    try {
      const pool = await api(`/v1/pool?minutes=${$("#pool-minutes").value}`);
      if (stopped) return;
      render(pool);
      $("#operator-error").textContent = "";
    } catch (err) {
      handleError(err, "#operator-error");
    }
    if (!stopped) timer = setTimeout(refresh, 2000);
  }
  $("#pool-minutes").onchange = () => { clearTimeout(timer); refresh(); };
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

// Runs ended per minute as stacked bars: completed, interrupted, failed.
function drawThroughput(box, series) {
  const width = Math.max(box.clientWidth || 900, 400), height = 120, bottom = 18, left = 30;
  const most = Math.max(1, ...series.map((m) => m.completed + m.failed + m.interrupted));
  const step = (width - left - 4) / Math.max(series.length, 1);
  const root = svg("svg", { width, height, role: "img", "aria-label": "runs ended per minute" });
  root.append(svg("text", { x: 2, y: 10, class: "axis" }, `${most}`), svg("text", { x: 2, y: height - bottom, class: "axis" }, "0"));
  series.forEach((m, i) => {
    let y = height - bottom;
    for (const [kind, colour] of [["completed", "#2fa860"], ["interrupted", "#c9a227"], ["failed", "#d63a3a"]]) {
      const h = (m[kind] / most) * (height - bottom - 14);
      if (!h) continue;
      y -= h;
      const bar = svg("rect", { x: left + i * step, y, width: Math.max(1, step - 1), height: h, fill: colour, class: `tp ${kind}` });
      bar.append(svg("title", {}, `${new Date(m.minute * 1000).toLocaleTimeString()}: ${m[kind]} ${kind}`));
      root.append(bar);
    }
  });
  const first = series[0], last = series[series.length - 1];
  if (first) root.append(svg("text", { x: left, y: height - 4, class: "axis" }, new Date(first.minute * 1000).toLocaleTimeString()));
  if (last) root.append(svg("text", { x: width - 4, y: height - 4, class: "axis", "text-anchor": "end" }, new Date(last.minute * 1000).toLocaleTimeString()));
  box.replaceChildren(root);
}

// A "worker died" marker of a run's timeline: a dashed line across every lane at the time the
// worker's liveness ran out, with a cross on the lane of the process that held the run's claim.
function drawWorkerDeaths(root, t, x, y, top, bottom) {
  for (const m of t.markers.filter((m) => m.kind === "worker_died")) {
    const at = x(m.at);
    const group = svg("g", { class: "worker-died" });
    group.append(svg("line", { x1: at, x2: at, y1: top - 4, y2: bottom, stroke: "#d63a3a", "stroke-dasharray": "4 3" }));
    if (m.lane && t.lanes.includes(m.lane)) group.append(svg("text", { x: at + 3, y: y(m.lane) + 16, class: "death-label" }, "✕ worker died"));
    group.append(svg("title", {}, m.text));
    root.append(group);
  }
}
