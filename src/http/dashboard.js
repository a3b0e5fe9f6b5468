"use strict";
// canaryd dashboard: vanilla JS, no build step. Reads /v1/replicas and /v1/hosts (the last
// doctor report per host; "Run doctor" calls /v1/hosts/{host}/doctor), follows active rollouts
// through /v1/rollouts/{id}/events (SSE read with fetch, so the bearer token can be sent),
// queries /v1/rollouts, and posts /v1/rollbacks after a reason and a confirmation. Releases:
// /v1/releases lists them; one is shown with its targets, followed through
// /v1/releases/{id}/events, and paused, resumed or aborted after a reason and a confirmation.
const REFRESH_MS = 3000;
const followed = new Map(); // rollout id -> {data, streaming}
let historyCursor = null;
let rollbackTarget = null;
let approveTarget = null; // {id, step}
let abortTarget = null; // the rollout's id
const doctorRunning = new Set(); // hosts whose doctor runs now
let shownRelease = null; // {id, data, streaming}
let releaseControl = null; // {id, verb}

function statusCell(s) { return el("span", {class: "status " + s, "data-status": s}, s); }
// A rollout's page (/rollouts/{id}) and a replica's (/replicas/{host}/{service}).
function rolloutPage(id) { return el("a", {href: "/rollouts/" + encodeURIComponent(id), class: "mono", "data-page-link": id}, id); }
function replicaPage(host, service) {
  return el("a", {href: "/replicas/" + encodeURIComponent(host) + "/" + encodeURIComponent(service), "data-replica-page": host + "/" + service}, service);
}

// ---- replicas -------------------------------------------------------------------------
async function loadReplicas() {
  const list = await api("/v1/replicas");
  const body = document.getElementById("replicas");
  body.replaceChildren(...list.map(r => {
    const d = r.current_deployment || {};
    const button = el("button", {type: "button", class: "danger", "data-rollback": r.host + "/" + r.service}, "Roll back…");
    button.addEventListener("click", () => openRollback(r.host, r.service));
    // A rollout took it down and none brought it back: nothing serves from it.
    const down = r.left_down ? el("strong", {"data-left-down": "true"}, " LEFT DOWN") : "";
    return el("tr", {"data-replica": r.host + "/" + r.service, class: r.left_down ? "left-down" : ""},
      el("td", {}, r.host), el("td", {class: "mono"}, replicaPage(r.host, r.service), down), el("td", {}, r.group),
      el("td", {class: "mono", "data-field": "tag"}, d.tag || "—"), el("td", {}, time(d.deployed_at)),
      el("td", {"data-field": "deployed-by"}, d.rollout_id ? rolloutPage(d.rollout_id) : (d.source || "")),
      el("td", {class: "mono"}, r.active_rollout ? rolloutPage(r.active_rollout) : ""),
      el("td", {}, button));
  }));
  for (const r of list) if (r.active_rollout) follow(r.active_rollout);
}

// ---- hosts and their doctor ------------------------------------------------------------
// GET /v1/hosts gives each host's last doctor report; "Run doctor" asks for a new one.
async function loadHosts() {
  const list = await api("/v1/hosts");
  const body = document.getElementById("hosts");
  body.replaceChildren(...list.map(h => {
    const d = h.last_doctor;
    const verdict = !d ? "not checked" : d.ok ? "ok" : "failed";
    const failing = d ? d.checks.filter(c => !c.ok) : [];
    const busy = doctorRunning.has(h.host);
    const button = el("button", {type: "button", "data-doctor-run": h.host, disabled: busy}, busy ? "Checking…" : "Run doctor");
    button.addEventListener("click", () => runDoctor(h.host));
    return el("tr", {"data-doctor-host": h.host, "data-doctor-status": d ? (d.ok ? "ok" : "failed") : "none",
                     class: d ? (d.ok ? "doctor-ok" : "doctor-failed") : ""},
      el("td", {}, h.host), el("td", {class: "doctor-verdict"}, verdict),
      el("td", {}, ...failing.map(c => el("div", {class: "doctor-failing", "data-doctor-check": c.name, title: c.detail},
        c.name + ": ", el("span", {class: "mono"}, c.detail)))),
      el("td", {}, d ? time(d.checked_at) : ""), el("td", {}, button));
  }));
}
async function runDoctor(host) {
  doctorRunning.add(host);
  loadHosts().catch(() => {});
  try { await api("/v1/hosts/" + encodeURIComponent(host) + "/doctor"); }
  catch (e) { say("doctor of " + host + ": " + e.message, true); }
  finally { doctorRunning.delete(host); loadHosts().catch(() => {}); }
}

// ---- active rollouts, live ------------------------------------------------------------
// A passed step's evidence in one line, as its kind renders it (the API's `summary`).
function stepSummary(s) {
  return s.summary ? " — " + s.summary : "";
}
// An analyze step's verdict: one small table per check (target, each peer, the peers'
// median, the ratio and its limit, the verdict), from the step's stored detail.
function num(x) {
  if (x === null || x === undefined || !isFinite(x)) return "-";
  return Number.isInteger(x) ? String(x) : x.toFixed(3);
}
function verdictTables(s) {
  const d = s.detail || {};
  if (!Array.isArray(d.checks) || d.checks.length === 0) return null;
  const target = Object.entries(d.replicas || {}).find(([, v]) => v.role === "target");
  const targetName = target ? target[0] : "";
  const cell = (name, text, cls) => el("td", {class: cls || "", "data-cell": name}, text);
  const reqs = o => o && o.requests !== null && o.requests !== undefined ? num(o.requests) + " requests" : "";
  const tables = d.checks.map(c => {
    const bounds = [c.max !== null && c.max !== undefined ? "≤ " + String(c.max) : null,
                    c.min !== null && c.min !== undefined ? "≥ " + String(c.min) : null].filter(x => x);
    const rows = [el("tr", {"data-row": "target"}, el("td", {}, "target"), el("td", {class: "mono"}, targetName),
      cell("target", num((c.target || {}).value), "num"), el("td", {}, reqs(c.target)),
      cell("bounds", bounds.length ? "limit " + bounds.join(" and ") : ""))];
    for (const [name, p] of Object.entries(c.peers || {})) {
      rows.push(el("tr", {"data-row": "peer"}, el("td", {}, "peer"), el("td", {class: "mono"}, name),
        cell("peer:" + name, num(p.value), "num"), el("td", {}, reqs(p)), el("td", {})));
    }
    if (Object.keys(c.peers || {}).length) {
      rows.push(el("tr", {"data-row": "median"}, el("td", {colSpan: 2}, "peers' median"),
        cell("median", num(c.peer_median), "num"), el("td", {}), el("td", {})));
    }
    if (c.max_ratio_to_peers !== null && c.max_ratio_to_peers !== undefined || (c.ratio !== null && c.ratio !== undefined)) {
      const limit = c.max_ratio_to_peers !== null && c.max_ratio_to_peers !== undefined ? "limit ≤ " + String(c.max_ratio_to_peers) + "×" : "";
      rows.push(el("tr", {"data-row": "ratio"}, el("td", {colSpan: 2}, "ratio to the median"),
        cell("ratio", c.ratio === null || c.ratio === undefined ? "-" : num(c.ratio) + "×", "num"), el("td", {}),
        cell("limit", limit)));
    }
    const verdict = c.verdict + (c.verdict === "inconclusive" ? (c.fails_step ? " (fails the step)" : " (does not fail the step)") : "");
    rows.push(el("tr", {"data-row": "verdict"}, el("td", {colSpan: 2}, "verdict"),
      cell("verdict", verdict, "status verdict-" + c.verdict), el("td", {colSpan: 2}, (c.reasons || []).join("; "))));
    return el("table", {class: "verdict", "data-check": c.name, "data-verdict": c.verdict},
      el("caption", {}, s.name + " · " + c.name + ": " + c.verdict), el("tbody", {}, ...rows));
  });
  return el("div", {class: "verdicts", "data-verdict-step": s.name}, ...tables);
}
function renderActive() {
  const box = document.getElementById("active");
  if (followed.size === 0) { box.replaceChildren(el("p", {class: "skipped"}, "none")); return; }
  const cards = [];
  for (const [id, f] of followed) {
    const r = f.data;
    if (!r) { cards.push(el("div", {class: "card", "data-rollout": id}, id)); continue; }
    const steps = el("ol", {class: "steps"}, ...r.steps.map(s =>
      el("li", {class: s.status, "data-step": s.name, "data-status": s.status,
                title: s.kind + (s.detail && s.detail.error ? " — " + s.detail.error.code + ": " + s.detail.error.message : stepSummary(s))},
         s.name + " · " + s.status + (s.attempts > 1 ? " ×" + s.attempts : ""))));
    // A running step that waits for an operator (an approve step, an analysis that asks).
    const waiting = r.status === "running" &&
      r.steps.find(s => s.status === "running" && s.detail && s.detail.awaiting_approval);
    let approve = null;
    if (waiting) {
      // A step waiting for a low-traffic window says when it opens; approving starts it now.
      const opens = waiting.detail.next_opening;
      const button = el("button", {type: "button", "data-approve": r.id}, opens ? "Start now…" : "Approve…");
      button.addEventListener("click", () => openApprove(r.id, waiting.name));
      const why = opens
        ? "Step " + waiting.name + " waits for the low-traffic window opening at " + time(opens) + " "
        : "Step " + waiting.name + " waits for an approval until " + time(waiting.detail.deadline) + " ";
      approve = el("div", {class: "waiting"}, why, button);
    }
    let abort = null;
    if (!terminal(r)) {
      abort = el("button", {type: "button", class: "danger", "data-abort": r.id}, "Abort…");
      abort.addEventListener("click", () => openAbort(r.id));
    }
    cards.push(el("div", {class: "card", "data-rollout": id, "data-status": r.status},
      el("h3", {}, r.kind + " ", rolloutPage(r.id), " ", statusCell(r.status), " ", abort),
      approve,
      el("div", {class: "mono"}, r.host + " / " + r.service + " → " + r.tag + "  (" + r.actor + ": " + r.reason + ")"),
      r.error ? el("div", {class: "failed"}, r.error.code + ": " + r.error.message) : null,
      steps, ...r.steps.map(verdictTables)));
  }
  box.replaceChildren(...cards);
}
async function refreshRollout(id) {
  const f = followed.get(id);
  if (!f) return;
  try { f.data = await api("/v1/rollouts/" + encodeURIComponent(id)); renderActive(); }
  catch (e) { say("rollout " + id + ": " + e.message, true); }
}
function follow(id) {
  if (followed.has(id)) return;
  followed.set(id, {data: null, streaming: false});
  refreshRollout(id).then(() => stream(id));
}
// Follows the rollout's SSE stream (common.js); falls back to polling if there is no stream.
async function stream(id) {
  const f = followed.get(id);
  if (!f || terminal(f.data)) return;
  f.streaming = true;
  document.getElementById("live").textContent = "live";
  try {
    await readEvents("/v1/rollouts/" + encodeURIComponent(id) + "/events", () => {}, () => refreshRollout(id), () => false);
  } catch (e) {
    document.getElementById("live").textContent = "polling";
  }
  f.streaming = false;
  await refreshRollout(id);
  if (!terminal(f.data)) setTimeout(() => stream(id), REFRESH_MS);
  else { loadReplicas().catch(() => {}); loadHistory(false).catch(() => {}); }
}

// ---- history --------------------------------------------------------------------------
async function loadHistory(more) {
  const form = new FormData(document.getElementById("filters"));
  const q = new URLSearchParams();
  for (const [k, v] of form) if (String(v).trim()) q.set(k, String(v).trim());
  if (more && historyCursor) q.set("cursor", historyCursor);
  const page = await api("/v1/rollouts?" + q.toString());
  const rows = page.items.map(r => {
    const tr = el("tr", {"data-history": r.id, "data-status": r.status},
      el("td", {}, time(r.created_at)), el("td", {class: "mono"}, rolloutPage(r.id)), el("td", {}, r.kind),
      el("td", {}, rolloutStatus(r)), el("td", {}, r.host), el("td", {class: "mono"}, r.service),
      el("td", {class: "mono"}, r.tag), el("td", {}, r.actor), el("td", {}, r.reason),
      el("td", {class: "failed"}, r.error ? r.error.code : ""));
    // The row opens the rollout's card here; its id is a link to the rollout's page.
    tr.addEventListener("click", ev => { if (!ev.target.closest("a")) follow(r.id); });
    return tr;
  });
  const body = document.getElementById("history");
  if (more) body.append(...rows); else body.replaceChildren(...rows);
  historyCursor = page.next_cursor;
  document.getElementById("history-more").hidden = !historyCursor;
}

// ---- two-step dialogs: a reason, then a confirmation ------------------------------------
// ---- rollback -------------------------------------------------------------------------
function openRollback(host, service) {
  rollbackTarget = {host, service};
  byId("rollback-target").textContent = service + " on " + host;
  byId("rollback-to-tag").value = "";
  byId("rollback-preempt").checked = false;
  openDialog("rollback-");
}
function closeRollback() {
  byId("rollback-panel").hidden = true;
  rollbackTarget = null;
}
function askRollback() {
  askDialog("rollback-", () => {
    const toTag = byId("rollback-to-tag").value.trim();
    return "Really roll back " + rollbackTarget.service + " on " + rollbackTarget.host + " to " +
      (toTag ? "tag " + toTag : "its prior deployment") + "? The replica restarts; its peers keep serving.";
  });
}
function confirmRollback() {
  const body = {
    host: rollbackTarget.host, service: rollbackTarget.service,
    reason: byId("rollback-reason").value.trim(),
    to_tag: byId("rollback-to-tag").value.trim() || null,
    preempt: byId("rollback-preempt").checked,
  };
  return confirmDialog("rollback-", "Rollback refused: ", async result => {
    const r = await api("/v1/rollbacks", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    result.textContent = "Rollback started: ";
    result.append(el("code", {"data-rollback-id": r.id}, r.id));
    follow(r.id);
    loadReplicas().catch(() => {});
    loadHistory(false).catch(() => {});
  });
}

// ---- approve --------------------------------------------------------------------------
function openApprove(id, step) {
  approveTarget = {id, step};
  byId("approve-rollout").textContent = id;
  byId("approve-step").textContent = step;
  openDialog("approve-");
}
function askApprove() {
  askDialog("approve-", () =>
    "Really approve step " + approveTarget.step + " of " + approveTarget.id + "? The rollout goes on to its next step.");
}
function confirmApprove() {
  const {id} = approveTarget;
  const reason = byId("approve-reason").value.trim();
  return confirmDialog("approve-", "Approval refused: ", async result => {
    await api("/v1/rollouts/" + encodeURIComponent(id) + "/approve",
      {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({reason})});
    result.textContent = "Approved: " + id;
    refreshRollout(id);
  });
}

// ---- abort ----------------------------------------------------------------------------
function openAbort(id) {
  abortTarget = id;
  byId("abort-rollout").textContent = id;
  openDialog("abort-");
}
function askAbort() {
  askDialog("abort-", () => {
    const f = followed.get(abortTarget);
    const r = (f && f.data) || {};
    return "Really abort " + (r.kind || "rollout") + " " + abortTarget + " of " + (r.service || "") + " on " +
      (r.host || "") + "? It stops before its next side effect; it does not roll back by itself.";
  });
}
function confirmAbort() {
  const id = abortTarget;
  const reason = byId("abort-reason").value.trim();
  return confirmDialog("abort-", "Abort refused: ", async result => {
    await api("/v1/rollouts/" + encodeURIComponent(id) + "/abort",
      {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({reason})});
    result.textContent = "Abort requested: " + id;
    refreshRollout(id);
  });
}

// ---- releases -------------------------------------------------------------------------
function releaseEnded(r) { return r && ["succeeded", "failed", "aborted"].includes(r.status); }
function progressText(p) { return Object.entries(p || {}).map(([k, n]) => n + " " + k).join(", "); }
async function loadReleases() {
  const page = await api("/v1/releases?limit=20");
  document.getElementById("releases").replaceChildren(...page.items.map(r => {
    const tr = el("tr", {"data-release": r.id, "data-status": r.status},
      el("td", {}, time(r.created_at)), el("td", {class: "mono"}, r.id), el("td", {}, statusCell(r.status)),
      el("td", {class: "mono"}, r.file), el("td", {class: "mono"}, r.tag), el("td", {}, progressText(r.progress)),
      el("td", {}, r.actor), el("td", {}, r.reason));
    tr.addEventListener("click", () => showRelease(r.id));
    return tr;
  }));
}
function showRelease(id) {
  if (shownRelease && shownRelease.id === id) { refreshRelease(); return; }
  shownRelease = {id, data: null, streaming: false};
  closeReleaseControl();
  refreshRelease().then(() => streamRelease(id));
}
async function refreshRelease() {
  const shown = shownRelease;
  if (!shown) return;
  try {
    const r = await api("/v1/releases/" + encodeURIComponent(shown.id));
    if (shownRelease !== shown) return;
    shown.data = r;
    renderRelease(r);
  } catch (e) { say("release " + shown.id + ": " + e.message, true); }
}
function renderRelease(r) {
  const view = document.getElementById("release-view");
  view.hidden = false;
  view.setAttribute("data-release-view", r.id);
  view.setAttribute("data-status", r.status);
  document.getElementById("release-id").textContent = r.id;
  document.getElementById("release-status").replaceChildren(statusCell(r.status));
  document.getElementById("release-meta").textContent = r.file + " → " + r.tag + " · runbook " + r.runbook +
    " · max_parallel_hosts " + r.max_parallel_hosts + " · on_failure " + r.on_failure + "  (" + r.actor + ": " + r.reason + ")";
  document.getElementById("release-progress").replaceChildren(...Object.entries(r.progress).map(([k, n]) =>
    el("span", {class: k, "data-progress": k}, n + " " + k)));
  document.getElementById("release-error").textContent = r.error || "";
  // What each control may do now (the API refuses the others anyway).
  document.getElementById("release-pause").hidden = !["pending", "running"].includes(r.status);
  document.getElementById("release-resume").hidden = r.status !== "paused";
  document.getElementById("release-abort").hidden = releaseEnded(r);
  document.getElementById("release-targets").replaceChildren(...r.targets.map(t => {
    let rollout = "";
    if (t.rollout_id) {
      rollout = el("a", {href: "/rollouts/" + encodeURIComponent(t.rollout_id), class: "mono", "data-rollout-link": t.rollout_id}, t.rollout_id);
    } else if (t.state === "already_current") {
      rollout = el("span", {class: "mute", "data-field": "no-rollout"}, "none: already at " + r.tag + ", nothing sent");
    } else if (t.state === "not_started") {
      rollout = el("span", {class: "mute", "data-field": "no-rollout"}, "none: the release ended first");
    }
    const rollback = t.rollback_id ? el("div", {class: "mono"}, "rollback " + t.rollback_id + " " + (t.rollback_status || "")) : null;
    return el("tr", {"data-target": t.host + "/" + t.service, "data-state": t.state},
      el("td", {}, String(t.position) + (t.canary ? " canary" : "")), el("td", {}, t.host),
      el("td", {class: "mono"}, t.service), el("td", {"data-field": "state"}, statusCell(t.state)),
      el("td", {}, rollout, rollback), el("td", {class: "mono", "data-field": "current-step"}, t.current_step || ""),
      el("td", {}, time(t.started_at)), el("td", {}, time(t.finished_at)),
      el("td", {"data-field": "downtime"}, t.downtime_ms == null ? "" : (t.downtime_ms / 1000).toFixed(1) + " s"),
      el("td", {class: "failed"}, t.error || ""));
  }));
  document.getElementById("release-events").replaceChildren(...r.events.map(e =>
    el("li", {"data-release-event": e.kind}, time(e.at) + " " + e.actor + " " + e.kind + (e.reason ? ": " + e.reason : ""))));
}
// The release's SSE stream, read with fetch like a rollout's: any event reads the release again.
async function streamRelease(id) {
  const shown = shownRelease;
  if (!shown || shown.id !== id || shown.streaming) return;
  shown.streaming = true;
  const live = document.getElementById("release-live");
  let ended = false;
  try {
    ended = await readEvents("/v1/releases/" + encodeURIComponent(id) + "/events",
      () => { live.textContent = "live"; },
      async () => { await refreshRelease(); loadReleases().catch(() => {}); },
      () => shownRelease !== shown);
  } catch (e) {
    live.textContent = "polling";
  }
  shown.streaming = false;
  if (shownRelease !== shown) return;
  await refreshRelease();
  loadReleases().catch(() => {});
  // The stream ends when nothing more can happen; otherwise reconnect.
  if (!ended || !releaseEnded(shown.data)) setTimeout(() => streamRelease(id), REFRESH_MS);
}
const RELEASE_QUESTIONS = {
  pause: "Running targets finish; no new target starts until it is resumed.",
  resume: "Targets start again as the ordering rules allow.",
  abort: "No target starts again, and the targets' running rollouts are aborted.",
};
function openReleaseControl(verb) {
  if (!shownRelease) return;
  releaseControl = {id: shownRelease.id, verb};
  byId("release-verb").textContent = verb[0].toUpperCase() + verb.slice(1);
  byId("release-target").textContent = shownRelease.id;
  openDialog("release-");
}
function closeReleaseControl() {
  byId("release-panel").hidden = true;
  releaseControl = null;
}
function askReleaseControl() {
  const {id, verb} = releaseControl;
  byId("release-confirm").textContent = "Yes, " + verb + " it";
  askDialog("release-", () => "Really " + verb + " release " + id + "? " + RELEASE_QUESTIONS[verb]);
}
function confirmReleaseControl() {
  const {id, verb} = releaseControl;
  const reason = byId("release-reason").value.trim();
  return confirmDialog("release-", verb + " refused: ", async result => {
    const r = await api("/v1/releases/" + encodeURIComponent(id) + "/" + verb,
      {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({reason})});
    result.textContent = verb + " of " + id + ": ";
    result.append(el("span", {"data-release-result": r.status}, r.status));
    if (shownRelease && shownRelease.id === id) { shownRelease.data = r; renderRelease(r); }
    loadReleases().catch(() => {});
  });
}

// ---- wiring -----------------------------------------------------------------------------
async function refreshAll() {
  try {
    await loadReplicas();
    await loadHosts();
    await loadReleases();
    if (shownRelease && !shownRelease.streaming) await refreshRelease();
    say("");
  } catch (e) {
    say(e.message + tokenHint(e), true);
  }
}
document.getElementById("token").value = token();
document.getElementById("token-save").addEventListener("click", () => {
  localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  refreshAll();
  loadHistory(false).catch(e => say(e.message, true));
});
document.getElementById("filters").addEventListener("submit", ev => {
  ev.preventDefault();
  loadHistory(false).catch(e => say(e.message, true));
});
document.getElementById("history-more").addEventListener("click", () => loadHistory(true).catch(e => say(e.message, true)));
wireDialog("rollback-", askRollback, confirmRollback, closeRollback);
wireDialog("approve-", askApprove, confirmApprove, () => { byId("approve-panel").hidden = true; });
wireDialog("abort-", askAbort, confirmAbort, () => { byId("abort-panel").hidden = true; });
for (const verb of ["pause", "resume", "abort"]) {
  byId("release-" + verb).addEventListener("click", () => openReleaseControl(verb));
}
wireDialog("release-", askReleaseControl, confirmReleaseControl, closeReleaseControl);
refreshAll();
loadHistory(false).catch(() => {});
// `/#release=ID` (a rollout page's link) opens that release.
const linked = /^#release=(.+)$/.exec(location.hash);
if (linked) showRelease(decodeURIComponent(linked[1]));
setInterval(refreshAll, REFRESH_MS);
