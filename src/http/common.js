"use strict";
// What the dashboard, the rollout page and the replica page share: the API token kept in the
// browser, calls of the API with it, the message line, DOM building and time formatting.
// Loaded before each page's own script.
const TOKEN_KEY = "canaryd.token";

function token() { return localStorage.getItem(TOKEN_KEY) || ""; }
function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}
function say(text, isError) {
  const m = document.getElementById("message");
  m.textContent = text || "";
  m.className = isError ? "error" : "";
}
async function api(path, options) {
  const res = await fetch(path, Object.assign({}, options || {}, {headers: headers((options || {}).headers)}));
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) {
    const err = new Error(body && body.error ? body.error.code + ": " + body.error.message : "HTTP " + res.status);
    err.status = res.status;
    throw err;
  }
  return body;
}
// What to add to a failed read's message: the token hint only when the daemon asked for one
// (401) and none is entered; a 404 is a rollout or replica that does not exist, whatever the token.
function tokenHint(e) { return e.status === 401 && !token() ? " — enter an API token above" : ""; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v; else if (k.startsWith("data-") || k.startsWith("aria-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c === null || c === undefined ? "" : c);
  return e;
}
function time(t) { return t ? t.replace("T", " ").replace(/\.\d+Z$/, "Z") : ""; }
function terminal(r) { return r && ["succeeded", "failed", "aborted"].includes(r.status); }
// A rollout's status as it tells the truth: a canary a rollback later undid says so, with a
// link to the rollback ("succeeded · rolled back by ro_…").
function rolloutStatus(r) {
  const cell = el("span", {class: "status " + r.status, "data-status": r.status}, r.status);
  if (!r.rolled_back_by) return cell;
  return el("span", {"data-rolled-back-by": r.rolled_back_by}, cell, " · rolled back by ",
    el("a", {href: "/rollouts/" + encodeURIComponent(r.rolled_back_by), class: "mono"}, r.rolled_back_by));
}
// Reads the SSE stream at `path` with fetch (EventSource cannot send Authorization). Any event
// means "something changed": `onChange` runs after each read that brought one. `onOpen` runs
// once the stream is open; `stop()` true cancels the read. Resolves to true when the server
// ended the stream, false when stopped; throws when it could not be opened or broke.
async function readEvents(path, onOpen, onChange, stop) {
  const res = await fetch(path, {headers: headers({Accept: "text/event-stream"})});
  if (!res.ok || !res.body) throw new Error("HTTP " + res.status);
  onOpen();
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    if (stop()) { reader.cancel().catch(() => {}); return false; }
    const {value, done} = await reader.read();
    if (done) return true;
    buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, "\n");
    let cut;
    let changed = false;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      if (/^data:/m.test(buffer.slice(0, cut))) changed = true;
      buffer = buffer.slice(cut + 2);
    }
    if (changed) await onChange();
  }
}

// ---- dialogs: a reason, then a confirmation ----------------------------------------------
// Each dialog's elements are named by a prefix ("rollback-", ...) and "panel", "reason",
// "result", "step1" (the reason), "step2" (the question), "submit", "back", "confirm" and
// "cancel".
const byId = id => document.getElementById(id);
function dialogStep(p, n) {
  byId(p + "step1").hidden = n !== 1;
  byId(p + "step2").hidden = n !== 2;
}
function openDialog(p) {
  byId(p + "reason").value = "";
  byId(p + "result").textContent = "";
  dialogStep(p, 1);
  byId(p + "panel").hidden = false;
  byId(p + "reason").focus();
}
// The reason typed, or "" after saying that one is required.
function dialogReason(p) {
  const reason = byId(p + "reason").value.trim();
  if (!reason) byId(p + "result").textContent = "A reason is required.";
  return reason;
}
// Shows `question` for confirmation when a reason was given.
function askDialog(p, question) {
  if (!dialogReason(p)) return;
  byId(p + "question").textContent = question();
  dialogStep(p, 2);
}
// Runs `send(result)` with the confirm button disabled; a refusal goes back to the reason.
async function confirmDialog(p, refused, send) {
  const result = byId(p + "result");
  byId(p + "confirm").disabled = true;
  try {
    await send(result);
    dialogStep(p, 0);
  } catch (e) {
    result.textContent = refused + e.message;
    dialogStep(p, 1);
  } finally {
    byId(p + "confirm").disabled = false;
  }
}
function wireDialog(p, ask, confirm, close) {
  byId(p + "submit").addEventListener("click", ask);
  byId(p + "cancel").addEventListener("click", close);
  byId(p + "back").addEventListener("click", () => dialogStep(p, 1));
  byId(p + "confirm").addEventListener("click", confirm);
}
