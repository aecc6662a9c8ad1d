// The run page: a run's facts and family, what a parked run waits on (the calls and their
// arguments), its timeline, its conversation grouped by step (the think, each tool call with its
// result, what happened in the step, its tokens and latency), its checkpoints, and recovery (retry,
// fork from a checkpoint). Loaded before console.js, whose helpers (api, el, $, when, seconds,
// follow, drawTimeline, handleError) it calls. Everything a run holds is shown as text.
"use strict";

// Step-less events of the run itself: shown in place, between the steps.
const RUN_LEVEL = new Set(["RunStarted", "SignalReceived", "Completed", "Failed", "Interrupted"]);
// A value longer than this (characters or lines) is folded: its first line shows, the rest opens.
const FOLD_CHARS = 240, FOLD_LINES = 6;

function runView(runId) {
  show("run-view");
  let stopped = false;
  let run = null;
  let checkpoints = [];
  let refreshTimer = null;
  let drawTimer = null;
  let hasChildren = false;
  const events = [];
  const controller = new AbortController();
  $("#run-title").textContent = `Run ${runId}`;
  $("#stream").textContent = "";
  $("#conversation").replaceChildren();
  $("#checkpoints tbody").replaceChildren();
  $("#timeline").replaceChildren();
  $("#run-children tbody").replaceChildren();
  $("#run-family").hidden = true;
  $("#run-error").textContent = "";
  $("#run-failure").hidden = true;
  $("#pending").hidden = true;
  $("#stream-box").hidden = true;

  // One refresh at a time: events come faster than a timeline is read, and a tenant's timelines
  // share two places per API process (429 past them). One asked for meanwhile runs after it.
  let refreshing = false;
  let again = false;
  async function refresh() {
    refreshTimer = null;
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      await refreshOnce();
    } finally {
      refreshing = false;
      if (again) { again = false; soon(); }
    }
  }
  async function refreshOnce() {
    try {
      const read = { signal: controller.signal };
      const [head, timeline, listed] = await Promise.all([
        api(`/v1/runs/${runId}`, read),
        api(`/v1/runs/${runId}/timeline`, read),
        api(`/v1/runs/${runId}/checkpoints`, read),
      ]);
      if (stopped) return;
      run = head;
      checkpoints = listed.checkpoints;
      renderHead(head);
      renderPending(head);
      renderFailure(head.error);
      $("#stream-box").hidden = TERMINAL.has(head.status) || !$("#stream").textContent;
      drawTimeline($("#timeline"), timeline, TERMINAL.has(head.status));
      renderCheckpoints(checkpoints, timeline, runId);
      if (hasChildren || (head.approval && head.approval.kind === "children")) await renderChildren(runId);
      draw();
    } catch (err) {
      if (!stopped) handleError(err, "#run-error");
    }
  }
  const soon = () => { if (!refreshTimer && !stopped) refreshTimer = setTimeout(refresh, 150); };
  // The conversation is drawn again from every event so far (a step's parts arrive apart).
  const draw = () => { if (!stopped) renderConversation(events, checkpoints); };
  const drawSoon = () => { if (!drawTimer) drawTimer = setTimeout(() => { drawTimer = null; draw(); }, 50); };

  async function act(verb) {
    const body = verb === "cancel" ? undefined : { note: $("#note").value };
    try {
      await api(`/v1/runs/${runId}/${verb}`, { method: "POST", body });
      $("#note").value = "";
      soon();
    } catch (err) {
      handleError(err, "#run-error");
    }
  }
  $("#approve").onclick = () => act("approve");
  $("#deny").onclick = () => act("deny");
  $("#cancel").onclick = () => act("cancel");
  $("#retry").onclick = async () => {
    $("#retry").disabled = true;
    try {
      const fresh = await api(`/v1/runs/${runId}/retry`, { method: "POST" });
      location.hash = `#/runs/${fresh.run_id}`;
    } catch (err) {
      handleError(err, "#run-error");
    } finally {
      $("#retry").disabled = false;
    }
  };
  $("#send-text").value = "";
  $("#send-result").textContent = "";
  $("#send-form").onsubmit = async (e) => {
    e.preventDefault();
    const text = $("#send-text").value;
    if (!text.trim()) return;
    try {
      const sent = await api(`/v1/runs/${runId}/messages`, { method: "POST", body: { text } });
      $("#send-text").value = "";
      $("#send-result").textContent = `message #${sent.id}: ${sent.status}`;
      soon();
    } catch (err) {
      // A send that crossed the run's end (or any refusal) says why beside the form.
      if (err instanceof ApiError) $("#send-result").textContent = `refused (${err.kind}): ${err.message}`;
      else handleError(err, "#run-error");
      soon();
    }
  };

  refresh().then(() => follow(runId, controller.signal, onEvent).catch((err) => {
    if (!stopped && err.name !== "AbortError") handleError(err, "#run-error");
  }).finally(() => { $("#run-live").hidden = true; soon(); }));

  function onEvent(event) {
    $("#run-live").hidden = false;
    if (event.kind === "TokenDelta") {
      // An ended run's replayed text is in its conversation: the bar is for a live one.
      if (run && !TERMINAL.has(run.status)) $("#stream-box").hidden = false;
      $("#stream").textContent += event.text;
      $("#stream").scrollTop = $("#stream").scrollHeight;
      return;
    }
    if (event.kind === "StepStarted") $("#stream").textContent = "";
    if (event.child_run_id) hasChildren = true;
    events.push(event);
    drawSoon();
    soon();
  }
  // While the run is live, the timeline's open end moves with the clock.
  const ticker = setInterval(() => { if (run && !TERMINAL.has(run.status)) soon(); }, 2000);
  return { stop() { stopped = true; controller.abort(); clearInterval(ticker); clearTimeout(refreshTimer); clearTimeout(drawTimer); } };
}

function renderHead(run) {
  const status = $("#run-status");
  status.className = `badge ${run.status}`;
  status.textContent = run.status;
  const parked = run.status === "awaiting_approval" && run.approval && run.approval.kind !== "children";
  $("#approve").hidden = !parked;
  $("#deny").hidden = !parked;
  $("#note").hidden = !parked;
  $("#cancel").hidden = TERMINAL.has(run.status);
  $("#retry").hidden = !TERMINAL.has(run.status) || Boolean(run.parent || run.link);
  $("#send-form").hidden = TERMINAL.has(run.status);
  $("#send-closed").hidden = !TERMINAL.has(run.status);
  const facts = [
    ["Agent", `${run.agent} v${run.agent_version}`], ["Model", run.model], ["Step", `${run.step} (${run.steps_used} of ${run.max_steps} used)`],
    ["Created", when(run.created_at)], ["Updated", when(run.updated_at)], ["Input", run.input],
    ["Tokens", `${run.usage.input_tokens ?? 0} in / ${run.usage.output_tokens ?? 0} out`],
  ];
  if (run.thread_id) facts.push(["Thread", run.thread_policy ? `${run.thread_id} (policy ${run.thread_policy})` : run.thread_id]);
  if (run.assistant) facts.push(["Assistant", `${run.assistant}@${run.assistant_version}`]);
  if (run.fork) facts.push(["Forked from", el("a", { href: `#/runs/${run.fork.run_id}` }, `${run.fork.run_id} v${run.fork.version}`)]);
  if (run.parent) {
    facts.push(["Parent run", el("span", {}, el("a", { href: `#/runs/${run.parent.run_id}`, id: "parent-link" }, run.parent.run_id),
      ` (its subagent call ${run.parent.call_id} in step ${run.parent.step})`)]);
  }
  if (run.link && run.link.kind === "pipeline") {
    facts.push(["Pipeline run", el("span", {}, el("a", { href: `#/pipelines/${run.link.pipeline_id}`, id: "pipeline-link" }, run.link.pipeline_id),
      ` (step ${run.link.seq}, item ${run.link.item}${run.link.attempt ? `, attempt ${run.link.attempt + 1}` : ""})`)]);
  }
  if (run.link && run.link.kind === "eval") facts.push(["Eval", evalCaseLink(run.link)]);
  if (run.handoffs && run.handoffs.length) {
    facts.push(["Now with", run.current_agent]);
    facts.push(["Handoffs", run.handoffs.map((h) => `step ${h.step}: ${h.from_agent} → ${h.to_agent} v${h.to_version}`).join("; ")]);
  }
  if (run.approval) facts.push(["Waiting on", `${run.approval.kind}: ${run.approval.reason}`]);
  if (run.waiting_for) facts.push(["Waiting for", run.waiting_for]);
  if (run.answer) facts.push(["Answer", run.answer]);
  if (run.error) facts.push(["Error", `${run.error.kind}: ${run.error.message}`]);
  $("#run-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// An eval's case run names its case in the eval viewer: /evals/ID#item=V:C:R opens that case and
// marks this run. An eval id holding "/" has no viewer page (null: shown as text).
function evalCaseHref(link) {
  if (!/^[A-Za-z0-9_.:@-]+$/.test(link.eval_id)) return null;
  return `/evals/${encodeURIComponent(link.eval_id)}#item=${encodeURIComponent(link.item)}`;
}

function evalCaseLink(link) {
  const [variant, index, repeat] = link.item.split(":");
  const where = `case ${index}, variant ${variant}, repeat ${repeat} of eval ${link.eval_id}`;
  const href = evalCaseHref(link);
  return href ? el("span", {}, el("a", { href, id: "eval-link" }, where), " (in the eval viewer)") : where;
}

// Who asks, for each kind of park (docs/agents.md, approvals).
const ASKED_BY = {
  tool_calls: "the agent's approval rule (approval_required)",
  unknown_outcome: "the policy's on_unknown_outcome: a worker died in a call that is not retry-safe",
  children: "its subagent calls: it goes on when their runs have all ended",
};

// What a parked run waits on: each call with its arguments, and why it was asked.
function renderPending(run) {
  const box = $("#pending");
  const approval = run.status === "awaiting_approval" ? run.approval : null;
  box.hidden = !approval;
  if (!approval) return box.replaceChildren();
  const calls = run.pending_calls.filter((c) => approval.call_ids.includes(c.id));
  const items = calls.map((c) => el("li", { class: "call", "data-call": c.id },
    el("div", { class: "kind" }, `${c.name} · ${c.id}`), valueBlock(c.arguments, "arguments")));
  for (const child of approval.children || []) {
    items.push(el("li", { class: "call", "data-call": child.call_id },
      el("div", { class: "kind" }, `${child.agent} · ${child.call_id}`),
      el("a", { href: `#/runs/${child.run_id}`, "data-child": child.run_id }, child.run_id), valueBlock(child.input, "task")));
  }
  box.replaceChildren(
    el("h3", {}, approval.kind === "children" ? "Waiting on its subagent runs" : "Waiting for a decision on"),
    el("p", { class: "asked" }, `Asked by ${ASKED_BY[approval.kind] || approval.kind}: ${approval.reason}`),
    el("ol", { class: "conversation" }, ...items));
}

// A failed run's error in full: kind, message, where, and its details.
function renderFailure(error) {
  const box = $("#run-failure");
  box.hidden = !error;
  if (!error) return box.replaceChildren();
  const where = [error.step ? `step ${error.step}` : "", error.tool ? `tool ${error.tool}` : ""].filter(Boolean).join(", ");
  box.replaceChildren(
    el("div", { class: "kind" }, `${error.kind}${where ? ` · ${where}` : ""}`),
    el("div", { class: "body" }, error.message),
    ...(error.details && Object.keys(error.details).length ? [valueBlock(error.details, "details")] : []));
}

async function renderChildren(runId) {
  const { runs } = await api(`/v1/runs/${runId}/children`);
  $("#run-family").hidden = !runs.length;
  $("#run-children tbody").replaceChildren(...runs.map((c) => el("tr", { "data-run": c.run_id },
    el("td", { class: "mono" }, el("a", { href: `#/runs/${c.run_id}` }, c.run_id)),
    el("td", {}, c.agent),
    el("td", {}, el("span", { class: `badge ${c.status}` }, c.status)),
    el("td", {}, c.parent ? `step ${c.parent.step}, call ${c.parent.call_id}` : ""),
    el("td", { class: "clip" }, c.error ? `${c.error.kind}: ${c.error.message}` : short(c.answer)))));
}

// A value as text: JSON (or a string holding JSON) pretty-printed; folded when long.
function valueBlock(value, label) {
  let text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  if (typeof value === "string" && /^\s*[[{]/.test(value)) {
    try { text = JSON.stringify(JSON.parse(value), null, 2); } catch (err) { /* not JSON: as it is */ }
  }
  text = text ?? "";
  const pre = el("pre", { class: "value" }, text);
  const lines = text.split("\n");
  if (text.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return pre;
  return el("details", { class: "fold" }, el("summary", {}, `${label}: ${short(lines[0], 80)} (${lines.length} lines, ${text.length} chars)`), pre);
}

// The events grouped: each step a block (its think, its calls each with its result and what the
// tool reported, its approvals, failures and handoffs), run-level events in place between them.
function renderConversation(events, checkpoints) {
  const voided = events.filter((e) => e.kind === "CustomEventsVoided");
  const isVoid = (e) => voided.some((v) => v.step === e.step && v.call_id === e.call_id && e.attempt <= v.attempt);
  const blocks = [];
  const steps = new Map();
  for (const event of events) {
    if (RUN_LEVEL.has(event.kind) || !event.step) { blocks.push({ event }); continue; }
    let step = steps.get(event.step);
    if (!step) {
      step = { n: event.step, events: [], calls: new Map() };
      steps.set(event.step, step);
      blocks.push({ step });
    }
    step.events.push(event);
  }
  const parkedCalls = (n) => {
    const parked = checkpoints.find((c) => c.step === n && c.status === "awaiting_approval" && c.approval);
    return new Map((parked ? parked.pending_calls : []).map((c) => [c.id, c]));
  };
  $("#conversation").replaceChildren(...blocks.map((b) => (b.event ? eventItem(b.event) : stepBlock(b.step, parkedCalls(b.step.n), isVoid))));
}

function stepBlock(step, parked, isVoid) {
  const started = step.events.find((e) => e.kind === "StepStarted");
  const thought = step.events.filter((e) => e.kind === "ModelResponded");
  const last = step.events[step.events.length - 1];
  const inTokens = thought.reduce((n, e) => n + (e.usage.input_tokens || 0), 0);
  const outTokens = thought.reduce((n, e) => n + (e.usage.output_tokens || 0), 0);
  const metrics = [`${inTokens} in / ${outTokens} out tokens`];
  if (started && thought.length) metrics.push(`think ${seconds(thought[thought.length - 1].ts - started.ts)}`);
  if (started && last.ts > started.ts) metrics.push(`step ${seconds(last.ts - started.ts)}`);
  const items = [];
  const calls = new Map();
  for (const event of step.events) {
    if (event.kind === "ToolDispatched") {
      const call = el("li", { class: "call", "data-kind": "ToolDispatched", "data-call": event.call_id },
        el("div", { class: "kind" }, `tool call · ${event.tool} · ${event.call_id}`),
        valueBlock(event.arguments, "arguments"),
        ...(event.child_run_id ? [el("div", {}, "subagent run ", el("a", { href: `#/runs/${event.child_run_id}`, "data-child": event.child_run_id }, event.child_run_id))] : []));
      calls.set(event.call_id, call);
      items.push(call);
    } else if (event.kind === "ToolCompleted" && calls.has(event.call_id)) {
      calls.get(event.call_id).append(resultItem(event));
    } else if ((event.kind === "CustomEvent" || event.kind === "CustomEventsDropped") && calls.has(event.call_id)) {
      const item = eventItem(event, "div");
      if (isVoid(event)) item.classList.add("void");
      calls.get(event.call_id).append(item);
    } else if (event.kind === "AwaitingApproval") {
      const call = parked.get(event.call_id);
      const item = eventItem(event);
      if (call) item.append(valueBlock(call.arguments, "arguments"));
      items.push(item);
    } else if (event.kind !== "StepStarted") {
      const item = eventItem(event);
      if ((event.kind === "CustomEvent" || event.kind === "CustomEventsDropped") && isVoid(event)) item.classList.add("void");
      items.push(item);
    }
  }
  return el("li", { class: "step", "data-step": step.n },
    el("div", { class: "step-head" }, el("b", {}, `Step ${step.n}`), ` · ${metrics.join(" · ")}`),
    el("ol", { class: "events" }, ...items));
}

function resultItem(event) {
  const item = el("div", { class: `result ${event.ok ? "ok" : "bad"}`, "data-kind": "ToolCompleted" },
    el("div", { class: "kind" }, `result · ${seconds(event.duration_s)}${event.attempt > 1 ? ` · attempt ${event.attempt}` : ""} · ${workerOf(event)}`));
  if (!event.ok && event.error) item.append(el("div", { class: "body" }, `${event.error.kind}: ${event.error.message}`));
  item.append(valueBlock(event.output, "output"));
  return item;
}

const workerOf = (event) => (event.worker ? `${event.worker.host}:${event.worker.pid}` : "");

function eventItem(event, tag = "li") {
  let kind = event.kind;
  let body = "";
  let cls = "";
  let value;
  switch (event.kind) {
    case "RunStarted": body = `agent ${event.agent} v${event.agent_version}, model ${event.model}`; break;
    case "ModelResponded":
      body = event.text || `${event.tool_calls} tool call(s)`; kind = "assistant"; cls = "think";
      if (event.truncated) body += " (cut at the output token limit)";
      break;
    case "ToolCompleted": return resultItem(event);
    case "CustomEvent":
      value = event.data; kind = `${event.name} · ${event.tool} ${event.call_id} (attempt ${event.attempt})`; cls = "custom"; break;
    case "CustomEventsDropped":
      body = `${event.dropped} custom event(s) dropped: over the call's bounds`; kind = `${event.tool} ${event.call_id} (attempt ${event.attempt})`;
      cls = "custom"; break;
    case "CustomEventsVoided":
      body = `custom events of attempt ${event.attempt} and earlier are void (${event.reason.replace("_", " ")})`;
      kind = `${event.tool} ${event.call_id}`; cls = "custom void"; break;
    case "StepFailed":
      body = `${event.error.kind}: ${event.error.message} → ${event.decision}`; cls = "bad";
      if (event.error.details && Object.keys(event.error.details).length) value = event.error.details;
      break;
    case "AwaitingApproval": body = `${event.tool} ${event.call_id}: ${event.reason}`; kind = "waiting for approval"; cls = "parked"; break;
    case "ApprovalDecided":
      kind = event.approve ? "approved" : "denied"; cls = event.approve ? "decided" : "decided bad";
      body = `${event.approve ? "approved" : "denied"}${event.always ? " (always, for the rest of the run)" : ""} by ${event.by || "someone unnamed"}${event.note ? `: ${event.note}` : ""}`;
      break;
    case "HandedOff":
      // The model's transfer call (a tool call the runtime answers, never dispatched to a tool).
      body = `${event.from_agent} → ${event.to_agent} v${event.to_version} by its transfer call ${event.call_id} (${event.history} history)`;
      kind = "handoff"; cls = "handoff"; break;
    case "Completed": body = event.answer; break;
    case "Failed":
      body = `${event.error.kind}: ${event.error.message}`; cls = "bad";
      if (event.error.details && Object.keys(event.error.details).length) value = event.error.details;
      break;
    case "Interrupted": body = event.reason; cls = "bad"; break;
    case "SignalReceived": body = `${event.signal} #${event.seq} received${event.by ? " from " + event.by : ""}`; kind = "sent in"; break;
    case "SignalApplied":
      body = `${event.signal} #${event.seq} ${event.accepted ? "applied" : "rejected: " + (event.error || "")}`;
      kind = "sent in"; cls = event.accepted ? "" : "bad"; break;
    case "VersionUpgraded": body = `${event.agent} ${event.from_version} → ${event.to_version} (${event.how})`; break;
    default: value = event;
  }
  const item = el(tag, { class: cls, "data-kind": event.kind },
    el("div", { class: "kind" }, `${kind} · step ${event.step} · ${workerOf(event)}`));
  if (body) item.append(el("div", { class: "body" }, body));
  if (value !== undefined) item.append(valueBlock(value, "data"));
  return item;
}

function renderCheckpoints(checkpoints, timeline, runId) {
  const by = new Map(timeline.bars.filter((b) => b.kind === "phase").map((b) => [b.ref, b]));
  $("#checkpoints tbody").replaceChildren(...checkpoints.map((c) => {
    const bar = by.get(`v${c.version}`);
    return el("tr", {}, el("td", {}, `v${c.version}`), el("td", {}, c.phase), el("td", {}, `${c.step}`),
      el("td", {}, when(c.updated_at)), el("td", { class: "mono" }, bar ? `${bar.name} on ${bar.lane}${bar.attempt > 1 ? ` (attempt ${bar.attempt})` : ""}` : ""),
      el("td", {}, el("button", { class: "fork", "data-version": c.version, onclick: () => forkFrom(runId, c.version) }, "Fork from here")));
  }));
}

// A new run from this checkpoint (POST /v1/runs/{id}/fork); its page is shown.
async function forkFrom(runId, version) {
  try {
    const run = await api(`/v1/runs/${runId}/fork`, { method: "POST", body: { version } });
    location.hash = `#/runs/${run.run_id}`;
  } catch (err) { handleError(err, "#run-error"); }
}

// -- the tenant's pipeline runs, newest first, each linked to its page -------------------------

function pipelinesView() {
  show("pipelines-view");
  let stopped = false;
  let timer = null;
  async function refresh() {
    if (stopped) return;
    try {
      const { pipelines } = await api("/v1/pipelines?limit=100");
      if (stopped) return;
      $("#pipelines tbody").replaceChildren(...pipelines.map((p) => el("tr", { "data-pipeline": p.pipeline_id },
        el("td", { class: "mono" }, el("a", { href: `#/pipelines/${p.pipeline_id}` }, p.pipeline_id)),
        el("td", {}, p.name),
        el("td", {}, el("span", { class: `badge ${p.status === "cancelled" ? "interrupted" : p.status}` }, p.status)),
        el("td", {}, when(p.created_at)),
        el("td", {}, p.finished_at ? seconds(p.finished_at - p.created_at) : ""))));
      $("#pipelines-error").textContent = "";
      timer = setTimeout(refresh, 2000);
    } catch (err) { handleError(err, "#pipelines-error"); }
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}
