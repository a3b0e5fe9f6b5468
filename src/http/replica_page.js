"use strict";
// One replica's page (/replicas/{host}/{service}): vanilla JS, DOM calls only. Reads
// /v1/replicas (what runs now, its active rollout) and /v1/replicas/{host}/{service}/deployments
// (newest first) and /v1/rollouts of the replica (to mark the deployments rollbacks made, and to
// list between them every rollout that deployed nothing: a failed canary, an aborted one),
// shows each deployment with the rollout that made it, rollbacks marked, and
// posts /v1/rollbacks after a reason and a confirmation, naming what it would roll back to.
const parts = location.pathname.split("/");
const host = decodeURIComponent(parts[2] || "");
const service = decodeURIComponent(parts[3] || "");

function rolloutLink(rid) { return el("a", {href: "/rollouts/" + encodeURIComponent(rid), class: "mono", "data-rollout-link": rid}, rid); }
function same(a, b) {
  return a.file === b.file && a.tag === b.tag && JSON.stringify(a.env_overrides || {}) === JSON.stringify(b.env_overrides || {});
}

// What a rollback redeploys: the newest deployment whose file, tag or env overrides differ
// from what runs now (as the daemon chooses it).
function priorOf(list) {
  const now = list[0];
  return now ? list.find(d => !same(d, now)) || null : null;
}

async function load() {
  try {
    const q = new URLSearchParams({host, service, limit: "100"});
    const [replicas, list, rollouts] = await Promise.all([
      api("/v1/replicas"),
      api("/v1/replicas/" + encodeURIComponent(host) + "/" + encodeURIComponent(service) + "/deployments"),
      api("/v1/rollouts?" + q.toString()),
    ]);
    // A deployment a rollback made (of the replica's newest 100 rollouts).
    const items = rollouts.items || [];
    const back = new Set(items.filter(x => x.kind === "rollback").map(x => x.id));
    const isBack = d => back.has(d.rollout_id);
    const r = replicas.find(x => x.host === host && x.service === service) || {};
    const now = r.current_deployment || list[0] || null;
    const rows = [];
    const row = (k, ...v) => rows.push(el("dt", {}, k), el("dd", {"data-field": k}, ...v));
    row("host", host);
    row("group", r.group || "");
    row("tag", el("span", {class: "mono"}, now ? now.tag : "—"));
    row("file", el("span", {class: "mono"}, now ? now.file : ""));
    row("deployed", now ? time(now.deployed_at) : "");
    row("by", now && now.rollout_id ? rolloutLink(now.rollout_id) : (now ? now.source : ""));
    if (r.active_rollout) row("active rollout", rolloutLink(r.active_rollout));
    if (r.left_down) row("state", el("strong", {class: "failed"}, "LEFT DOWN: no container runs"));
    document.getElementById("now").replaceChildren(...rows);

    const prior = priorOf(list);
    const active = replicas.find(x => x.host === host && x.active_rollout);
    preempting = active ? active.active_rollout : null;
    const said = prior ?
      el("span", {"data-rollback-to": prior.tag}, "A rollback redeploys ", el("code", {}, prior.tag), " (" + prior.file + ", deployed " + time(prior.deployed_at) + ").") :
      el("span", {class: "mute", "data-rollback-to": ""}, "No earlier deployment differs from what runs: there is nothing to roll back to.");
    document.getElementById("rollback-to").replaceChildren(preempting ?
      el("span", {"data-preempt": preempting}, "Rollout ", rolloutLink(preempting), " is active on " + host +
        ": the button aborts it first (before its next step), then rolls " + service + " back to its prior deployment.") : said);
    const open = document.getElementById("rollback-open");
    open.textContent = preempting ? "Abort " + preempting + " and roll back…" : "Roll back…";
    open.disabled = !prior && !preempting;
    rollbackTo = prior;

    // Oldest first: the replica's tags over time.
    document.getElementById("strip").replaceChildren(...list.slice().reverse().map(d =>
      el("span", {class: isBack(d) ? "rollback" : "", title: time(d.deployed_at) + " " + d.source}, d.tag + (isBack(d) ? " ↩" : ""))));
    const deployed = list.map(d => ({at: d.deployed_at, row: el("tr",
      {"data-deployment": d.id, "data-rollback": isBack(d) ? "true" : "false", class: isBack(d) ? "rollback" : ""},
      el("td", {}, time(d.deployed_at)), el("td", {class: "mono"}, d.tag), el("td", {class: "mono"}, d.file),
      el("td", {}, isBack(d) ? el("strong", {}, "rollback") : d.rollout_id ? "canary" : d.source),
      el("td", {}, d.rollout_id ? rolloutLink(d.rollout_id) : ""),
      el("td", {class: "mono"}, Object.keys(d.env_overrides || {}).join(", ")))}));
    // Every rollout that ended without deploying (a failed or aborted canary, a failed
    // rollback), between the deployments, where it ended.
    const made = new Set(list.map(d => d.rollout_id).filter(Boolean));
    const attempts = items.filter(x => terminal(x) && !made.has(x.id)).map(x => ({at: x.finished_at || x.created_at, row: el("tr",
      {"data-attempt": x.id, "data-status": x.status, class: "attempt"},
      el("td", {}, time(x.finished_at || x.created_at)), el("td", {class: "mono"}, x.tag), el("td", {class: "mono"}, x.file),
      el("td", {}, x.kind + " ", rolloutStatus(x), x.error ? " (" + x.error.code + ")" : ""),
      el("td", {}, rolloutLink(x.id)), el("td", {class: "mono"}, (x.env_overrides || []).join(", ")))}));
    const table = deployed.concat(attempts).sort((a, b) => (a.at < b.at ? 1 : a.at > b.at ? -1 : 0));
    document.getElementById("deployments").replaceChildren(...table.map(x => x.row));
    say("");
  } catch (e) {
    say(e.message + tokenHint(e), true);
  }
}

// ---- rollback: a reason, then a confirmation ----------------------------------------------
// While a rollout is active on the host (this replica's canary, or another replica's), the
// button aborts it first (the API's `preempt`): on-call's "abort and roll back".
let rollbackTo = null;
let preempting = null; // the host's active rollout id, or null
function rollbackQuestion() {
  const to = rollbackTo && !preempting ? rollbackTo.tag : "its prior deployment (the daemon chooses it)";
  return (preempting ? "Really abort " + preempting + " and roll back " : "Really roll back ") +
    service + " on " + host + " to " + to + "? The replica restarts; its peers keep serving.";
}
function confirmRollback() {
  const body = {host, service, reason: byId("rollback-reason").value.trim(), to_tag: null, preempt: !!preempting};
  return confirmDialog("rollback-", "Rollback refused: ", async result => {
    const r = await api("/v1/rollbacks", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    byId("rollback-panel").hidden = true;
    result.replaceChildren("Rollback started: ", rolloutLink(r.id));
    load();
  });
}
byId("rollback-open").addEventListener("click", () => openDialog("rollback-"));
wireDialog("rollback-", () => askDialog("rollback-", rollbackQuestion), confirmRollback,
  () => { byId("rollback-panel").hidden = true; });

document.getElementById("replica-name").textContent = host + "/" + service;
document.getElementById("token").value = token();
document.getElementById("token-save").addEventListener("click", () => {
  localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  load();
});
load();
