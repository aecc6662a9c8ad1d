// The assistants page (#/assistants): the tenant's assistants, the versions of one, what changed
// between two of them, a rollback to any earlier one, and deleting one (a second click confirms:
// runs already pinned to it go on, but no new run can name it). Names and configurations are
// producer-written: they are rendered as text, never as markup.
"use strict";

function assistantsView() {
  show("assistants-view");
  let chosen = null;
  const value = (v) => (v === null || v === undefined ? "(the agent's own)" : typeof v === "string" ? v : JSON.stringify(v));

  async function list() {
    try {
      const { assistants } = await api("/v1/assistants?limit=500");
      $("#assistants tbody").replaceChildren(...assistants.map((a) =>
        el("tr", { "data-assistant": a.name },
          el("td", {}, el("a", { href: "#/assistants", onclick: (e) => { e.preventDefault(); open(a.name); } }, a.name)),
          el("td", {}, a.agent), el("td", {}, `v${a.version}`), el("td", {}, when(a.updated_at)))));
      $("#assistants-note").textContent = assistants.length ? "" : "No assistants yet (POST /v1/assistants).";
      if (chosen) await open(chosen);
    } catch (err) { handleError(err, "#assistants-error"); }
  }

  async function open(name) {
    chosen = name;
    $("#assistant-box").hidden = false;
    $("#assistant-title").textContent = `Assistant ${name}`;
    const remove = $("#assistant-delete");
    remove.textContent = "Delete this assistant";
    remove.classList.remove("confirm");
    $("#assistant-diff tbody").replaceChildren();
    try {
      const { versions } = await api(`/v1/assistants/${encodeURIComponent(name)}/versions?limit=500`);
      const current = versions.length ? versions[0].version : 0;
      $("#assistant-versions tbody").replaceChildren(...versions.map((v) =>
        el("tr", { "data-version": v.version },
          el("td", {}, `v${v.version}${v.version === current ? " (current)" : ""}`),
          el("td", {}, when(v.created_at)),
          el("td", {}, v.restored_from ? `rollback to v${v.restored_from}` : ""),
          el("td", { class: "value" }, JSON.stringify(v.config)),
          el("td", {}, v.version === current ? "" : el("button", { class: "rollback", onclick: () => rollback(name, v.version, current) }, "Roll back to this")))));
      for (const id of ["#diff-from", "#diff-to"]) {
        $(id).replaceChildren(...versions.map((v) => el("option", { value: v.version }, `v${v.version}`)));
      }
      if (versions.length > 1) { $("#diff-from").value = versions[1].version; $("#diff-to").value = versions[0].version; }
      $("#assistants-error").textContent = "";
    } catch (err) { handleError(err, "#assistants-error"); }
  }

  async function diff() {
    try {
      const d = await api(`/v1/assistants/${encodeURIComponent(chosen)}/diff?from=${$("#diff-from").value}&to=${$("#diff-to").value}`);
      $("#assistant-diff tbody").replaceChildren(...(d.changes.length ? d.changes.map((c) =>
        el("tr", { "data-field": c.field, class: `change ${c.change}` },
          el("td", { class: "mono" }, c.field), el("td", {}, c.change),
          el("td", { class: "value" }, value(c.before)), el("td", { class: "value" }, value(c.after))))
        : [el("tr", {}, el("td", { colspan: 4 }, "No difference."))]));
    } catch (err) { handleError(err, "#assistants-error"); }
  }

  async function rollback(name, version, current) {
    try {
      await api(`/v1/assistants/${encodeURIComponent(name)}/rollback`, { method: "POST", body: { version, if_version: current } });
      await list();
    } catch (err) { handleError(err, "#assistants-error"); }
  }

  async function remove() {
    const button = $("#assistant-delete");
    if (!chosen) return;
    if (!button.classList.contains("confirm")) {
      button.classList.add("confirm");
      button.textContent = `Delete ${chosen}: no new run can name it (click again)`;
      return;
    }
    const name = chosen;
    try {
      await api(`/v1/assistants/${encodeURIComponent(name)}`, { method: "DELETE" });
      chosen = null;
      $("#assistant-box").hidden = true;
      await list();
    } catch (err) { handleError(err, "#assistants-error"); }
  }

  $("#diff-form").onsubmit = (e) => { e.preventDefault(); if (chosen) diff(); };
  $("#assistant-delete").onclick = remove;
  $("#assistant-box").hidden = true;
  list();
  return { stop() {} };
}
