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
