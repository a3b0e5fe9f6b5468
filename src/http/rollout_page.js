"use strict";
// One rollout's page (/rollouts/{id}): vanilla JS, no build step, every element built by DOM
// calls (the policy allows no inline script or style). Reads /v1/rollouts/{id} (steps, their
// evidence and compose calls), /v1/rollouts/{id}/audit and /oncall_hints.json, and follows
// /v1/rollouts/{id}/events (SSE read with fetch, so the bearer token can be sent) while it
// runs. A step's evidence is drawn from its shape, never from its kind's name: a plan's
// buckets, compose calls, stream tails, counts, matched lines, an approval, and an analysis's
// per-interval series as one chart per check.
const SVG = "http://www.w3.org/2000/svg";
const TICK_MS = 500;
const id = decodeURIComponent(location.pathname.split("/")[2] || "");
let rollout = null;
let hints = {};
let streaming = false;
const opened = new Set(); // names of the steps shown open

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, String(v));
  for (const c of children) e.append(c);
  return e;
}
function ms(t) { return t ? Date.parse(t) : null; }
function duration(d) {
  if (d === null || d === undefined || !isFinite(d)) return "";
  if (d < 1000) return Math.round(d) + " ms";
  if (d < 60000) return (d / 1000).toFixed(d < 10000 ? 2 : 1) + " s";
  const m = Math.floor(d / 60000);
  return m + " m " + Math.round((d % 60000) / 1000) + " s";
}
function num(x) {
  if (x === null || x === undefined || !isFinite(x)) return "-";
  if (Number.isInteger(x)) return String(x);
  return Math.abs(x) >= 100 ? x.toFixed(1) : Math.abs(x) >= 1 ? x.toFixed(3) : x.toPrecision(3);
}
// A round top for an axis, at least `v`: 1, 2, 4 or 5 times a power of ten, so that its half
// is round too.
function niceCeil(v) {
  if (!(v > 0) || !isFinite(v)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 4, 5, 10]) if (m * p >= v * (1 - 1e-9)) return m * p;
  return 10 * p;
}
// A value with its unit: seconds below one as milliseconds; no unit, the number alone.
function withUnit(v, unit) {
  if (v === null || v === undefined || !isFinite(v)) return "-";
  if (unit !== "s") return num(v);
  return Math.abs(v) < 1 ? num(Math.round(v * 1e6) / 1e3) + " ms" : num(v) + " s";
}
function statusText(s) { return el("span", {class: "status " + s, "data-status": s}, s); }
function rolloutLink(rid) { return el("a", {href: "/rollouts/" + encodeURIComponent(rid), class: "mono", "data-rollout-link": rid}, rid); }

// ---- header ---------------------------------------------------------------------------
// How long the replica was out of service, and its parts (`downtime` in the API).
function downtimeText(d, ended) {
  const p = d.parts || {};
  const has = v => v !== undefined && v !== null;
  const up = has(p.pull_ms) && has(p.up_ms)
    ? "up call (pull and build " + duration(p.pull_ms) + ", create " + duration(Math.max(p.up_ms - p.pull_ms, 0)) + ")"
    : "up call (pull, build, create)";
  const parts = [["down call", p.down_ms], ["between", p.between_ms], [up, p.up_ms], ["cold start", p.cold_start_ms]]
    .filter(([, v]) => v !== undefined && v !== null)
    .map(([k, v]) => k + " " + duration(v));
  const total = d.total_ms !== undefined && d.total_ms !== null
    ? duration(d.total_ms)
    : ended ? "not back healthy when the rollout ended" : duration(Date.now() - ms(d.down_at)) + " so far";
  return el("span", {"data-downtime": d.total_ms === undefined ? "" : String(d.total_ms)}, total + (parts.length ? " (" + parts.join(", ") + ")" : ""));
}

function renderHeader(r) {
  document.title = "canaryd " + r.kind + " " + r.service + " → " + r.tag + " (" + r.status + ")";
  document.getElementById("status").replaceChildren(rolloutStatus(r));
  const rows = [];
  const row = (k, ...v) => rows.push(el("dt", {}, k), el("dd", {"data-field": k}, ...v));
  row("kind", r.kind);
  row("host", r.host);
  const replica = el("a", {href: "/replicas/" + encodeURIComponent(r.host) + "/" + encodeURIComponent(r.service), class: "mono", "data-replica-link": r.host + "/" + r.service}, r.service);
  const former = r.replaces && r.replaces.service ? " (renamed from " + r.replaces.service + ")" : r.deploy_as ? " (deployed as " + r.deploy_as + ")" : "";
  row("service", replica, former);
  row("file", el("span", {class: "mono"}, r.file));
  row("tag", el("span", {class: "mono"}, r.tag));
  row("env overrides", r.env_overrides.length ? el("span", {class: "mono"}, r.env_overrides.join(", ")) : el("span", {class: "mute"}, "none"));
  row("runbook", el("span", {class: "mono"}, r.runbook));
  row("actor", r.actor);
  row("reason", r.reason);
  row("created", time(r.created_at));
  row("started", time(r.started_at));
  row("finished", time(r.finished_at));
  const start = ms(r.started_at) || ms(r.created_at);
  row("took", duration((ms(r.finished_at) || Date.now()) - start) + (terminal(r) ? "" : " so far"));
  if (r.downtime) row("replica down", downtimeText(r.downtime, terminal(r)));
  if (r.rollback_of) row("rollback of", rolloutLink(r.rollback_of));
  if (r.rolled_back_by) row("rolled back by", rolloutLink(r.rolled_back_by));
  if (r.release_id) row("release", el("a", {href: "/#release=" + encodeURIComponent(r.release_id), class: "mono", "data-release-link": r.release_id}, r.release_id));
  document.getElementById("summary").replaceChildren(...rows);
  document.getElementById("abort-box").hidden = terminal(r);
  if (terminal(r)) document.getElementById("abort-panel").hidden = true;
  const box = document.getElementById("error");
  box.hidden = !r.error;
  if (r.error) {
    const hint = hints[r.error.code];
    box.replaceChildren(
      el("div", {}, el("strong", {class: "failed", "data-error-code": r.error.code}, r.error.code), ": ", r.error.message),
      hint ? el("div", {class: "hint", "data-hint": r.error.code}, "On-call: " + hint) : "");
  }
}

// ---- timeline -------------------------------------------------------------------------
// The scale: from the first step's start to the last end (now while running).
function span(r) {
  const now = Date.now();
  let lo = ms(r.started_at) || ms(r.created_at) || now;
  let hi = ms(r.finished_at) || (terminal(r) ? lo : now);
  for (const s of r.steps) {
    if (s.started_at) lo = Math.min(lo, ms(s.started_at));
    const end = stepEnd(s, r, now);
    if (end !== null) hi = Math.max(hi, end);
  }
  return {lo, hi: Math.max(hi, lo + 1)};
}
function stepEnd(s, r, now) {
  if (!s.started_at) return null;
  if (s.finished_at) return ms(s.finished_at);
  return s.status === "running" ? now : (ms(r.finished_at) || ms(s.started_at));
}
// A step that sent compose calls is an action; any other is a wait or a check.
function stepShape(s) { return s.calls && s.calls.length ? "action" : "wait"; }
const WIDTH = 1000;
// Where each step's bar lies on the scale, how long it took (so far) and its label.
function geometry(r) {
  const now = Date.now();
  const {lo, hi} = span(r);
  const x = t => ((t - lo) / (hi - lo)) * WIDTH;
  const steps = r.steps.map(s => {
    const end = stepEnd(s, r, now);
    const took = end === null ? null : end - ms(s.started_at);
    const bx = end === null ? null : x(ms(s.started_at));
    const bw = end === null ? null : Math.max(x(end) - bx, 2);
    const label = s.status + (took !== null ? " · " + duration(took) : "") + (s.attempts > 1 ? " · " + s.attempts + " calls" : "");
    return {s, took, bx, bw, label};
  });
  // The replica out of service (the rollout's downtime), shaded behind every step's bar.
  let out = null;
  if (r.downtime && r.downtime.down_at) {
    const end = ms(r.downtime.back_at) || (terminal(r) ? ms(r.finished_at) : now) || now;
    const x0 = x(ms(r.downtime.down_at));
    out = {x: x0, w: Math.max(x(end) - x0, 1)};
  }
  return {lo, hi, steps, out};
}
function renderAxis(r, lo, hi) {
  document.getElementById("axis").replaceChildren(
    el("span", {}, time(new Date(lo).toISOString())), el("span", {"data-axis": "total"}, duration(hi - lo)),
    el("span", {}, terminal(r) ? time(new Date(hi).toISOString()) : "now"));
}
function renderTimeline(r) {
  const focused = document.activeElement && document.activeElement.getAttribute("data-step-summary");
  const {lo, hi, steps, out} = geometry(r);
  renderAxis(r, lo, hi);
  const list = document.getElementById("timeline");
  const items = steps.map(({s, took, bx, bw, label}) => {
    const shape = stepShape(s);
    const bar = svg("svg", {class: "bar", viewBox: "0 0 " + WIDTH + " 16", preserveAspectRatio: "none", "aria-hidden": "true"},
      svg("rect", {class: "track", x: 0, y: 0, width: WIDTH, height: 16}));
    if (out) bar.append(svg("rect", {class: "out", "data-out": s.name, x: out.x.toFixed(2), y: 0, width: out.w.toFixed(2), height: 16}));
    if (bx !== null) {
      bar.append(svg("rect", {class: "step-bar " + shape + " " + s.status, "data-bar": s.name, x: bx.toFixed(2), y: 2,
        width: bw.toFixed(2), height: 12, "data-duration-ms": Math.round(took)}));
    }
    const summary = el("summary", {"data-step-summary": s.name},
      el("span", {class: "name"}, el("strong", {}, s.name), " ", el("span", {class: "mute"}, s.kind + " · " + shape)),
      bar, el("span", {class: "label " + s.status, "data-label": s.name}, label));
    const details = el("details", {"data-step": s.name, "data-status": s.status, "data-shape": shape, "data-duration-ms": took === null ? "" : String(Math.round(took))},
      summary);
    if (opened.has(s.name)) { details.open = true; details.append(evidence(s, r)); }
    details.addEventListener("toggle", () => {
      if (details.open) { opened.add(s.name); if (details.children.length === 1) details.append(evidence(s, r)); }
      else opened.delete(s.name);
    });
    return el("li", {}, details);
  });
  list.replaceChildren(...items);
  if (focused) {
    const again = list.querySelector('[data-step-summary="' + CSS.escape(focused) + '"]');
    if (again) again.focus();
  }
}
// Between events the running step's bar grows (and the others shrink to the longer scale):
// the drawn elements are moved in place, so focus and open steps stay as they are.
function tick() {
  if (!rollout || terminal(rollout)) return;
  const {lo, hi, steps} = geometry(rollout);
  renderAxis(rollout, lo, hi);
  const list = document.getElementById("timeline");
  for (const {s, took, bx, bw, label} of steps) {
    const sel = '[data-step="' + CSS.escape(s.name) + '"]';
    const bar = list.querySelector(sel + " rect.step-bar");
    if (bar && bx !== null) {
      bar.setAttribute("x", bx.toFixed(2));
      bar.setAttribute("width", bw.toFixed(2));
      bar.setAttribute("data-duration-ms", String(Math.round(took)));
    }
    const details = list.querySelector(sel);
    if (details && took !== null) details.setAttribute("data-duration-ms", String(Math.round(took)));
    const text = list.querySelector(sel + " [data-label]");
    if (text) text.textContent = label;
  }
}

// ---- evidence -------------------------------------------------------------------------
// Evidence keys drawn in their own sections (keys of the evidence, not step kinds: a dry run's
// buckets are under `plan` whatever step made it).
const SHOWN_APART = new Set("error plan allow tail checks series replicas target_logs approval forbidden".split(" "));
// A link that downloads `text` as a file `name` (an investigation keeps the block).
function download(name, text) {
  return el("a", {href: "data:text/plain;charset=utf-8," + encodeURIComponent(text), download: name, "data-download": name}, "Download " + name);
}
// A forbidden line, the whole block it begins (a stall dump's stacks) and what the watched
// companion (the proxy) said of the target around then.
function forbiddenLine(s, f) {
  const out = [el("h3", {}, "Forbidden line"), el("p", {}, el("code", {}, f.pattern), " matched: ", el("span", {class: "mono"}, f.line))];
  if (Array.isArray(f.block)) {
    const text = f.block.join("\n");
    out.push(el("pre", {"data-block": s.name}, text), download(s.name + "-block.txt", text));
  }
  if (Array.isArray(f.companion_lines)) {
    out.push(el("h3", {}, "The watched service's lines naming the target, then"),
      el("pre", {"data-companion-lines": s.name}, f.companion_lines.join("\n")));
  }
  return out;
}
function evidence(s, r) {
  const d = s.detail || {};
  const box = el("div", {class: "evidence", "data-evidence": s.name});
  box.append(el("dl", {}, el("dt", {}, "started"), el("dd", {}, time(s.started_at)),
    el("dt", {}, "finished"), el("dd", {}, time(s.finished_at)),
    s.deadline_at ? el("dt", {}, "deadline") : "", s.deadline_at ? el("dd", {}, time(s.deadline_at)) : ""));
  if (s.summary) box.append(el("p", {}, s.summary));
  if (d.error && d.error.code) {
    box.append(el("p", {class: "failed"}, el("strong", {}, d.error.code), ": " + (d.error.message || "")));
  }
  if (d.approval) box.append(el("h3", {}, "Approved"), fields(d.approval, "approval"));
  if (d.plan && typeof d.plan === "object") box.append(el("h3", {}, "Plan"), buckets(d.plan, d.allow || [], r));
  if (s.calls && s.calls.length) box.append(el("h3", {}, "compose-manager calls"), calls(s.calls));
  if (Array.isArray(d.tail) && d.tail.length) {
    box.append(el("h3", {}, "Stream tail" + (d.lines !== undefined ? " (" + d.lines + " lines)" : "")), el("pre", {"data-tail": s.name}, d.tail.join("\n")));
  }
  if (Array.isArray(d.checks) && d.checks.length) box.append(el("h3", {}, "Analysis"), analysis(s, d));
  if (d.forbidden && typeof d.forbidden === "object") box.append(...forbiddenLine(s, d.forbidden));
  const rest = {};
  for (const [k, v] of Object.entries(d)) if (!SHOWN_APART.has(k)) rest[k] = v;
  if (Object.keys(rest).length) box.append(el("h3", {}, "Evidence"), fields(rest, s.name));
  if (d.replicas && typeof d.replicas === "object") box.append(el("h3", {}, "Replicas read"), fields(d.replicas, "replicas"));
  if (Array.isArray(d.target_logs) && d.target_logs.length) {
    box.append(el("details", {}, el("summary", {}, "The target's last " + d.target_logs.length + " log lines"), el("pre", {}, d.target_logs.join("\n"))));
  }
  box.append(el("details", {}, el("summary", {}, "All evidence as JSON"), el("pre", {}, JSON.stringify(d, null, 2))));
  return box;
}
// Any value: scalars inline, lists of scalars joined, lists of objects as tables, objects nested.
function value(v, depth) {
  if (v === null || v === undefined) return el("span", {class: "mute"}, "—");
  if (typeof v !== "object") return el("span", {class: typeof v === "string" ? "" : "mono"}, String(v));
  if (Array.isArray(v)) {
    if (v.length === 0) return el("span", {class: "mute"}, "none");
    if (v.every(x => x === null || typeof x !== "object")) return el("span", {class: "mono"}, v.join(", "));
    if (v.every(x => x && typeof x === "object" && !Array.isArray(x)) && depth < 3) return table(v.slice(0, 100), depth);
    return el("pre", {}, JSON.stringify(v, null, 1));
  }
  if (depth >= 3) return el("pre", {}, JSON.stringify(v));
  return fields(v, null, depth + 1);
}
function fields(o, name, depth) {
  const dl = el("dl", name ? {"data-fields": name} : {});
  for (const [k, v] of Object.entries(o)) dl.append(el("dt", {}, k), el("dd", {"data-key": k}, value(v, depth || 1)));
  return dl;
}
function table(rows, depth) {
  const keys = [...new Set(rows.flatMap(r => Object.keys(r)))];
  return el("div", {class: "scroll"}, el("table", {},
    el("thead", {}, el("tr", {}, ...keys.map(k => el("th", {}, k)))),
    el("tbody", {}, ...rows.map(r => el("tr", {}, ...keys.map(k => el("td", {}, value(r[k], depth + 1))))))));
}
// A dry-run plan: each bucket's services against what the runbook allowed.
function buckets(plan, allow, r) {
  const ok = new Set(allow.concat([r.service, r.deploy_as, r.replaces && r.replaces.service].filter(x => x)));
  const rows = ["create", "recreate", "remove", "unchanged"].filter(b => Array.isArray(plan[b])).map(b => {
    const services = plan[b];
    const changed = b !== "unchanged";
    const cell = el("td", {class: changed && services.length ? "changed" : ""});
    services.forEach((svc, i) => {
      if (i) cell.append(", ");
      cell.append(el("span", {class: "mono" + (changed && !ok.has(svc) ? " unallowed" : "")}, svc));
    });
    if (!services.length) cell.append(el("span", {class: "mute"}, "none"));
    return el("tr", {"data-bucket": b}, el("th", {}, b), cell);
  });
  rows.push(el("tr", {}, el("th", {}, "allowed"), el("td", {class: "mono"}, [...ok].join(", ") || "the target only")));
  return el("table", {class: "buckets"}, el("tbody", {}, ...rows));
}
function calls(list) {
  return el("div", {class: "scroll"}, el("table", {class: "calls"},
    el("thead", {}, el("tr", {}, ...["#", "endpoint", "outcome", "started", "took", "error"].map(h => el("th", {}, h)))),
    el("tbody", {}, ...list.map(c => el("tr", {"data-call": String(c.n)},
      el("td", {}, String(c.n)), el("td", {class: "mono"}, c.endpoint),
      el("td", {}, statusText(c.outcome || "in flight")), el("td", {}, time(c.started_at)),
      el("td", {}, c.finished_at ? duration(ms(c.finished_at) - ms(c.started_at)) : ""),
      el("td", {class: "failed"}, c.error || ""))))));
}

// ---- analysis charts -----------------------------------------------------------------
function median(xs) {
  const v = xs.filter(x => x !== null && isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}
function analysis(s, d) {
  const target = Object.entries(d.replicas || {}).find(([, v]) => v.role === "target");
  const targetName = target ? target[0] : null;
  const charts = d.checks.map(c => chart(c, (d.series || {})[c.name], targetName, d));
  return el("div", {class: "charts", "data-analysis": s.name}, ...charts);
}
// One check: the target's value per interval against each peer's, the peers' median, the
// threshold (max_ratio_to_peers × the median) and any absolute bound; the warm-up shaded.
function chart(c, series, targetName, d) {
  const W = 560, H = 260, L = 56, R = 12, T = 34, B = 28;
  const ratioText = c.ratio !== null && c.ratio !== undefined ? num(c.ratio) + "×" : "no ratio";
  const limitText = c.max_ratio_to_peers !== null && c.max_ratio_to_peers !== undefined ? " (limit " + c.max_ratio_to_peers + "×)" : "";
  const caption = el("figcaption", {}, c.name + ": ", el("span", {class: c.verdict}, c.verdict), " · " + ratioText + limitText);
  const fig = el("figure", {class: "chart", "data-chart": c.name, "data-verdict": c.verdict}, caption);
  const points = series && series.points ? series.points : null;
  if (!points || !targetName || !points[targetName]) {
    fig.append(el("p", {class: "mute"}, "No per-interval series stored for this check."));
    return fig;
  }
  const peers = Object.keys(points).filter(n => n !== targetName);
  const times = [...new Set(Object.values(points).flatMap(p => p.map(x => x[0])))].sort((a, b) => a - b);
  const at = name => new Map(points[name].map(([t, v]) => [t, v]));
  const targetAt = at(targetName);
  const peerAt = peers.map(at);
  const medianAt = new Map(times.map(t => [t, median(peerAt.map(m => m.has(t) ? m.get(t) : null))]));
  const ratio = c.max_ratio_to_peers;
  const thresholdAt = new Map(times.map(t => [t, ratio !== null && ratio !== undefined && medianAt.get(t) !== null ? ratio * medianAt.get(t) : null]));
  const values = [...targetAt.values(), ...peerAt.flatMap(m => [...m.values()]), ...thresholdAt.values(),
                  c.max, c.min].filter(v => v !== null && v !== undefined && isFinite(v));
  const warmEnd = ms(d.warmup_ends_at);
  const t0 = Math.min(times[0], warmEnd || times[0]) - 1, t1 = times[times.length - 1];
  const vmax = niceCeil(Math.max(...values, 0) * 1.05);
  const counter = series.shape === "counter";
  const unit = series.unit || null;
  const x = t => L + ((t - t0) / Math.max(t1 - t0, 1)) * (W - L - R);
  const y = v => T + (1 - v / vmax) * (H - T - B);
  const g = svg("svg", {class: "chart", viewBox: "0 0 " + W + " " + H, role: "img", "data-ymax": vmax,
    "aria-label": c.name + ": " + c.verdict + ", " + ratioText + limitText});
  if (warmEnd && warmEnd > t0) {
    g.append(svg("rect", {class: "warmup", "data-shade": "warmup", x: L, y: T, width: Math.max(x(Math.min(warmEnd, t1)) - L, 0).toFixed(1), height: H - T - B}));
    g.append(svg("text", {x: L + 4, y: H - B - 4}, document.createTextNode("warm-up")));
  }
  for (const f of [0, 0.5, 1]) {
    const v = vmax * f;
    g.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v)}));
    g.append(svg("text", {x: L - 4, y: y(v) + 4, "text-anchor": "end", "data-tick": v}, document.createTextNode(withUnit(v, unit))));
  }
  if (counter) {
    g.append(svg("text", {x: 0, y: 0, "text-anchor": "middle", "data-axis-title": "y",
      transform: "translate(12," + (T + (H - T - B) / 2) + ") rotate(-90)"}, document.createTextNode("per interval")));
  }
  g.append(svg("line", {class: "axis-line", x1: L, x2: W - R, y1: H - B, y2: H - B}));
  g.append(svg("text", {x: L, y: H - 8}, document.createTextNode(time(new Date(t0 + 1).toISOString()).slice(11))));
  g.append(svg("text", {x: W - R, y: H - 8, "text-anchor": "end"}, document.createTextNode(duration(t1 - t0) + " shown")));
  // A line's points, as drawn: "x,y" per interval with a value; its numbers in data-values.
  const line = (cls, name, m) => {
    const pts = times.filter(t => m.get(t) !== null && m.get(t) !== undefined);
    if (!pts.length) return null;
    return svg("polyline", {class: cls, "data-line": name, points: pts.map(t => x(t).toFixed(1) + "," + y(m.get(t)).toFixed(1)).join(" "),
      "data-times": pts.join(","), "data-values": pts.map(t => m.get(t)).join(",")});
  };
  if (counter) {
    // One slot per interval inside the plot, its bars side by side with a gap: none spills
    // over the axis labels.
    const slot = (W - L - R) / Math.max(times.length, 1);
    const w = Math.max(slot / (peers.length + 2), 1);
    times.forEach((t, k) => {
      const series = [[targetName, targetAt, "bar-target"], ...peers.map((p, i) => [p, peerAt[i], "bar-peer"])];
      series.forEach(([name, m, cls], i) => {
        const v = m.get(t);
        if (v === null || v === undefined) return;
        g.append(svg("rect", {class: cls, "data-bar": name, "data-value": v, x: (L + k * slot + (i + 0.5) * w).toFixed(1), y: y(v).toFixed(1), width: w.toFixed(1), height: Math.max(H - B - y(v), 0).toFixed(1)}));
      });
    });
  } else {
    peers.forEach((p, i) => { const l = line("peer", "peer:" + p, peerAt[i]); if (l) g.append(l); });
    if (peers.length > 1) { const l = line("median", "median", medianAt); if (l) g.append(l); }
    const th = line("threshold", "threshold", thresholdAt);
    if (th) g.append(th);
    const tl = line("target", "target", targetAt);
    if (tl) g.append(tl);
  }
  for (const [bound, v] of [["max", c.max], ["min", c.min]]) {
    if (v === null || v === undefined) continue;
    g.append(svg("line", {class: "threshold", "data-line": bound, "data-value": v, x1: L, x2: W - R, y1: y(v), y2: y(v)}));
    g.append(svg("text", {x: W - R - 4, y: y(v) - 4, "text-anchor": "end"}, document.createTextNode(bound + " " + withUnit(v, unit))));
  }
  g.append(svg("text", {class: "verdict-" + c.verdict, "data-label": "verdict", x: L, y: 16},
    document.createTextNode(c.verdict.toUpperCase() + " · " + ratioText + limitText)));
  g.append(svg("text", {x: L, y: 29}, document.createTextNode(
    "window: target " + withUnit((c.target || {}).value, unit) + ", peers' median " + withUnit(c.peer_median, unit) + (c.target && c.target.requests !== null ? ", " + num(c.target.requests) + " requests" : ""))));
  if (c.reasons && c.reasons.length) fig.append(el("p", {class: c.verdict, "data-reasons": c.name}, c.reasons.join("; ")));
  fig.append(g, el("div", {class: "chart-legend"},
    counter ? "bars per interval: red " + targetName + " (canary), blue the peers" :
      "red: " + targetName + " (canary) · blue: " + (peers.join(", ") || "no peer") + (peers.length > 1 ? " · dotted: the peers' median" : "") +
      (ratio !== null && ratio !== undefined ? " · dashed: threshold, " + ratio + " × the peers' " + (peers.length > 1 ? "median" : "value") : "") +
      " · grey: warm-up (not judged)"));
  return fig;
}

// ---- audit events ----------------------------------------------------------------------
function renderAudit(items) {
  document.getElementById("audit").replaceChildren(...items.map(e => {
    const why = e.detail && (e.detail.reason || (e.detail.error && e.detail.error.code)) || "";
    return el("li", {"data-audit": e.kind},
      time(e.occurred_at) + " " + e.actor + " " + e.kind + (e.step ? " [" + e.step + "]" : "") +
      (e.from_state || e.to_state ? " " + (e.from_state || "") + "→" + (e.to_state || "") : "") + (why ? ": " + why : ""));
  }));
}

// ---- loading and following ---------------------------------------------------------------
async function refresh() {
  try {
    const [r, audit] = await Promise.all([
      api("/v1/rollouts/" + encodeURIComponent(id)),
      api("/v1/rollouts/" + encodeURIComponent(id) + "/audit"),
    ]);
    // At first, the failed step (or the one a `#step=NAME` link names) is shown open.
    if (!rollout) {
      const named = /^#step=(.+)$/.exec(location.hash);
      for (const st of r.steps) if (st.status === "failed" || (named && decodeURIComponent(named[1]) === st.name)) opened.add(st.name);
    }
    rollout = r;
    renderHeader(r);
    renderTimeline(r);
    renderAudit(audit.items || []);
    say("");
  } catch (e) {
    say(e.message + tokenHint(e), true);
  }
}
async function follow() {
  if (streaming || !rollout || terminal(rollout)) return;
  streaming = true;
  const live = document.getElementById("live");
  try {
    await readEvents("/v1/rollouts/" + encodeURIComponent(id) + "/events",
      () => { live.textContent = "live"; }, refresh, () => false);
  } catch (e) {
    live.textContent = "polling";
  }
  streaming = false;
  await refresh();
  if (terminal(rollout)) live.textContent = "";
  else setTimeout(follow, 3000);
}

// ---- abort: a reason, then a confirmation ---------------------------------------------------
function abortQuestion() {
  const r = rollout || {};
  return "Really abort " + (r.kind || "rollout") + " " + id + " of " + (r.service || "") + " on " + (r.host || "") +
    "? It stops before its next side effect; a compose call in flight finishes. A canary that already touched " +
    "its replica is not rolled back by the abort: roll it back from the replica page if needed.";
}
function confirmAbort() {
  const reason = byId("abort-reason").value.trim();
  return confirmDialog("abort-", "Abort refused: ", async result => {
    await api("/v1/rollouts/" + encodeURIComponent(id) + "/abort",
      {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({reason})});
    result.textContent = "Abort requested: the rollout stops before its next side effect.";
    refresh();
  });
}
byId("abort-open").addEventListener("click", () => openDialog("abort-"));
wireDialog("abort-", () => askDialog("abort-", abortQuestion), confirmAbort, () => { byId("abort-panel").hidden = true; });

document.getElementById("rollout-id").textContent = id;
document.getElementById("token").value = token();
document.getElementById("token-save").addEventListener("click", () => {
  localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  refresh().then(follow);
});
fetch("/oncall_hints.json").then(r => r.json()).then(h => { hints = h || {}; if (rollout) renderHeader(rollout); }).catch(() => {});
refresh().then(follow);
setInterval(tick, TICK_MS);
