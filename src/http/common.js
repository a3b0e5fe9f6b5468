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
    const err = body && body.error ? body.error.code + ": " + body.error.message : "HTTP " + res.status;
    throw new Error(err);
  }
  return body;
}
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
