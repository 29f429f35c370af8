// The llmman dashboard (docs/dashboard.md): polls the daemon that serves it every 2 s for the whole pool:
// its nodes, what is being pulled, copied or loaded, loaded and stored models, the request log.
// Everything comes from that daemon; the API key, when one is needed, stays in sessionStorage and is sent
// as "Authorization: Bearer" on every data call, never in a URL.
"use strict";

const KEY = "llmman.key";
const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
let timer = null;
let view = { pool: [], ps: [], devices: {} };

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

class Unauthorized extends Error {}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const r = await fetch(path, opts);
  if (r.status === 401) throw new Unauthorized("unauthorized");
  if (!r.ok) {
    let message = r.status + " " + r.statusText;
    try { const body = await r.json(); message = body.error && (body.error.message || body.error) || message; }
    catch (e) { /* not JSON */ }
    throw new Error(String(message));
  }
  return r;
}

const json = async (path, options) => (await api(path, options)).json();

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

const num = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function bar(fraction) {
  const inner = el("div");
  inner.style.width = Math.max(0, Math.min(1, fraction)) * 100 + "%";
  return el("div", { class: "bar" }, inner);
}

function same(node, data) {
  // True when ``node`` already shows ``data`` (then it is left as is: a button being clicked stays).
  const key = JSON.stringify(data);
  if (node.dataset.shown === key) return true;
  node.dataset.shown = key;
  return false;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// Nodes ------------------------------------------------------------------------------------------------

function deviceTable(devices) {
  if (!devices || !devices.length) return null;
  const rows = devices.map((d) => el("tr", {},
    el("td", {}, d.index + " " + d.name),
    el("td", { class: "num" }, d.used !== undefined ? bytes(d.used) + " / " + bytes(d.total) : bytes(d.total)),
    el("td", { class: "num" }, d.utilisation !== undefined ? d.utilisation + " %" : "–"),
    el("td", { class: "num" }, d.temperature !== undefined ? d.temperature + " °C" : "–"),
    el("td", { class: "num" }, d.power !== undefined ? num(d.power, 0) + " W" : "–")));
  return el("table", { class: "devices" },
    el("thead", {}, el("tr", {}, el("th", {}, "device"), el("th", {}, "memory"), el("th", {}, "util"),
      el("th", {}, "temp"), el("th", {}, "power"))),
    el("tbody", {}, ...rows));
}

function renderNodes(nodes, devices) {
  if (same($("nodes"), [nodes.map((n) => Object.assign({}, n, { last_seen: null })), devices])) return;
  $("nodes").replaceChildren(...nodes.map((n) => {
    const used = n.memory ? (n.memory - n.free) / n.memory : 0;
    const badges = [el("span", { class: "badge " + n.state }, n.state)];
    if (n.fallback) badges.push(el("span", { class: "badge fallback" }, "fallback"));
    const models = Object.keys(n.models || {});
    return el("div", { class: "card node", "data-node": n.name, "data-state": n.state },
      el("h3", {}, n.name || n.address, ...badges),
      el("div", { class: "muted" }, n.address + (n.self ? " · this node" : "") +
        (n.version ? " · v" + n.version : "") + (n.why ? " · " + n.why : "")),
      bar(used),
      el("div", {}, n.memory ? bytes(n.memory - n.free) + " of " + bytes(n.memory) + " used" : "memory unknown",
        " · " + models.length + " loaded · " + n.stored + " stored"),
      deviceTable(devices[n.address]));
  }));
}

// In progress: pulls and copies (each node's /llmman/node transfers), and loads ----------------------------

function seconds(s) {
  s = Math.max(0, Math.round(s));
  return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : Math.round(s / 3600) + " h";
}

function nodeName(address) {
  // A copy's source is the peer's host:port as its node knows it: the pool's name for it when known.
  const n = view.pool.find((p) => p.address === address);
  return n ? n.name : address;
}

function transferRow(node, t) {
  const verb = t.kind === "copy" ? "copying from " + nodeName(t.source) : "pulling from " + t.source;
  const what = t.error ? t.kind + " failed: " + t.error : verb;
  const fraction = t.total ? t.completed / t.total : 0;
  const amount = t.total ? Math.floor(fraction * 100) + " % · " + bytes(t.completed) + " / " + bytes(t.total)
    : "starting…";
  return el("tr", { class: "transfer" + (t.error ? " failed" : ""), "data-model": t.model,
    "data-node": node.name, "data-kind": t.kind },
  el("td", {}, t.model), el("td", {}, node.name), el("td", { class: "what" }, what),
  el("td", { class: "amount" }, bar(fraction), amount), el("td", { class: "num" }, seconds(t.elapsed)));
}

function loadRow(m) {
  const node = psNode(m);
  const name = node ? node.name : m.node;
  const since = Date.parse(m.started_at);
  return el("tr", { class: "load", "data-model": m.name, "data-node": name, "data-kind": "load" },
    el("td", {}, m.name), el("td", {}, name), el("td", { class: "what" }, "loading on " + name),
    el("td", { class: "amount" }, bar(0), ""),
    el("td", { class: "num" }, isNaN(since) ? "–" : seconds((Date.now() - since) / 1000)));
}

function loading(m) {
  return String(m.processor || "").includes("loading") || Boolean((poolLoad(m) || {}).loading);
}

function renderProgress(devices, ps) {
  const moving = devices.map((n) => [n, n.transfers || []]).filter(([, ts]) => ts.length);
  const loads = ps.filter(loading);
  // Redrawn at every poll (its figures and times move; it has no buttons).
  fill($("progress").tBodies[0], [
    ...moving.flatMap(([n, ts]) => ts.map((t) => transferRow(n, t))), ...loads.map(loadRow)]);
  $("progress-none").classList.toggle("hidden", moving.length + loads.length > 0);
}

// Models -----------------------------------------------------------------------------------------------

function poolLoad(entry) {
  const node = psNode(entry);
  if (!node) return null;
  for (const [ref, load] of Object.entries(node.models || {})) {
    if (ref === entry.name || ref.endsWith("/" + entry.name) || ref === entry.model) return load;
  }
  return null;
}

function expires(text) {
  const t = Date.parse(text);
  if (isNaN(t)) return "";
  const s = Math.round((t - Date.now()) / 1000);
  if (s > 10 * 365 * 86400) return "never";
  if (s <= 0) return "now";
  return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : Math.round(s / 3600) + " h";
}

async function action(what, run) {
  $("action-status").textContent = what + "…";
  try {
    await run();
    $("action-status").textContent = what + ": done";
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    $("action-status").textContent = what + ": " + e.message;
  }
  refresh();
}

function on(node, name) {
  // This node's own route, or /llmman/on/<host:port>/api/<name> to make the call on a peer.
  return node.self ? "/api/" + name : "/llmman/on/" + encodeURIComponent(node.address) + "/api/" + name;
}

const post = (node, name, body) => api(on(node, name), {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

const load = (node, model) => action("loading " + model + " on " + node.name,
  () => post(node, "generate", { model: model, keep_alive: "5m", stream: false }));

const unload = (node, model) => action("unloading " + model + " on " + node.name,
  () => post(node, "generate", { model: model, keep_alive: 0, stream: false }));

function remove(node, model) {
  if (!window.confirm("Delete " + model + " from " + node.name + "'s store?")) return;
  action("deleting " + model + " on " + node.name, () => api(on(node, "delete"), {
    method: "DELETE", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: model }) }));
}

function psNode(entry) {
  // /api/ps names "local" or the peer's host:port.
  const where = entry.node;
  return view.pool.find((n) => (where === undefined || where === "local") ? n.self : n.address === where);
}

function renderLoaded(ps) {
  if (same($("loaded"), [ps.map((m) => [m.name, m.node, m.size, expires(m.expires_at), poolLoad(m)])])) return;
  fill($("loaded").tBodies[0], ps.map((m) => {
    const node = psNode(m);
    const l = poolLoad(m) || {};
    return el("tr", { "data-model": m.name, "data-node": node ? node.name : "" },
      el("td", {}, m.name), el("td", {}, node ? node.name : m.node), el("td", { class: "num" }, bytes(m.size)),
      el("td", { class: "num" }, l.slots ?? "–"), el("td", { class: "num" }, l.in_flight ?? "–"),
      el("td", { class: "num" }, l.queued ?? "–"), el("td", {}, l.loading ? "loading" : expires(m.expires_at)),
      el("td", {}, node ? el("button", { type: "button", class: "unload", onclick: () => unload(node, m.name) },
        "Unload") : null));
  }));
}

async function storedOn(node) {
  // Each node's own store: the hop mark makes /api/tags this node's alone; a peer's through /llmman/on/.
  try {
    const tags = await json(on(node, "tags"), { headers: { "x-llmman-hop": "1" } });
    return (tags.models || []).map((m) => [node, m]);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    return [];
  }
}

function renderStored(stored) {
  if (same($("stored"), stored.map(([node, m]) => [node.address, node.name, m.name, m.size]))) return;
  fill($("stored").tBodies[0], stored.map(([node, m]) => el("tr", { "data-model": m.name, "data-node": node.name },
    el("td", {}, m.name), el("td", {}, node.name), el("td", { class: "num" }, bytes(m.size)),
    el("td", {},
      el("button", { type: "button", class: "load", onclick: () => load(node, m.name) }, "Load"), " ",
      el("button", { type: "button", class: "delete danger", onclick: () => remove(node, m.name) }, "Delete")))));
}

function renderPullNodes(nodes) {
  const select = $("pull-node");
  const wanted = select.value;
  const up = nodes.filter((n) => n.state !== "down");
  if (select.options.length === up.length && up.every((n, i) => select.options[i].value === n.address)) return;
  select.replaceChildren(...up.map((n) => el("option", { value: n.address }, "on " + n.name)));
  if (up.some((n) => n.address === wanted)) select.value = wanted;
}

async function pull(event) {
  event.preventDefault();
  const name = $("pull-name").value.trim();
  const node = view.pool.find((n) => n.address === $("pull-node").value) || view.pool[0];
  const progress = $("pull-progress");
  const status = $("pull-status");
  progress.classList.remove("hidden");
  progress.value = 0;
  status.textContent = "pulling " + name + " on " + node.name + "…";
  try {
    const r = await post(node, "pull", { model: name, stream: true });
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop();
      for (const line of lines) {
        if (!line.trim()) continue;
        const msg = JSON.parse(line);
        if (msg.error) throw new Error(msg.error);
        if (msg.total) progress.value = (msg.completed || 0) / msg.total;
        status.textContent = msg.status + (msg.total ? " " + bytes(msg.completed || 0) + " / " + bytes(msg.total) : "");
      }
    }
    progress.value = 1;
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    status.textContent = "pull failed: " + e.message;
  }
  refresh();
}

// Requests ---------------------------------------------------------------------------------------------

function chart(svg, points) {
  const W = 300, H = 80, P = 4;
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const shape = (tag, attrs) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    svg.append(node);
    return node;
  };
  if (!points.length) { shape("text", { x: P, y: H / 2 }).textContent = "no data"; return; }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const top = Math.max(...points.map((p) => p[1])) || 1;
  const x = (t) => P + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - 2 * P);
  const y = (v) => H - P - (v / top) * (H - 2 * P - 10);
  const xy = points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1));
  shape("polyline", { points: xy.join(" ") });
  if (points.length === 1) shape("circle", { cx: x(points[0][0]), cy: y(points[0][1]), r: 2 });
  shape("text", { x: P, y: 10 }).textContent = "max " + top.toFixed(top < 10 ? 2 : 0);
}

function requestQuery() {
  const q = new URLSearchParams({ pool: "1", limit: "200", since: $("f-since").value });
  for (const [id, key] of [["f-model", "model"], ["f-node", "node"], ["f-status", "status"]]) {
    const v = $(id).value.trim();
    if (v) q.set(key, v);
  }
  return q.toString();
}

function renderRequests(rows) {
  if (same($("requests"), rows)) return;
  fill($("requests").tBodies[0], rows.map((r) => el("tr", { class: r.status >= 400 || r.error ? "error" : "" },
    el("td", {}, new Date(r.time * 1000).toLocaleTimeString()), el("td", {}, r.node), el("td", {}, r.route),
    el("td", {}, r.model), el("td", { class: "num" }, r.status),
    el("td", { class: "num" }, (r.prompt_tokens ?? "–") + " / " + (r.completion_tokens ?? "–")),
    el("td", { class: "num" }, num(r.ttft, 3)), el("td", { class: "num" }, num(r.tokens_per_s, 1)),
    el("td", {}, r.error || ""))));
  const old = rows.slice().reverse();
  chart($("chart-tps"), old.filter((r) => r.tokens_per_s != null).map((r) => [r.time, r.tokens_per_s]));
  chart($("chart-ttft"), old.filter((r) => r.ttft != null).map((r) => [r.time, r.ttft]));
}

function renderStats(stats) {
  if (same($("stats"), stats)) return;
  fill($("stats").tBodies[0], stats.map((s) => el("tr", {},
    el("td", {}, s.model), el("td", {}, s.node), el("td", { class: "num" }, s.requests),
    el("td", { class: "num" }, s.errors), el("td", { class: "num" }, s.tokens_in + " / " + s.tokens_out),
    el("td", { class: "num" }, num(s.tokens_per_s_avg, 1)), el("td", { class: "num" }, num(s.tokens_per_s_peak, 1)),
    el("td", { class: "num" }, num(s.ttft_p50, 3) + " / " + num(s.ttft_p95, 3)),
    el("td", { class: "num" }, num(s.latency_p50, 2) + " / " + num(s.latency_p95, 2)))));
}

// Polling and login ------------------------------------------------------------------------------------

async function refresh() {
  clearTimeout(timer);
  try {
    const pool = await json("/llmman/pool");
    const up = pool.nodes.filter((n) => n.state !== "down");
    const [devices, ps, requests, stats, ...stored] = await Promise.all([
      json("/llmman/devices?pool=1"), json("/api/ps"), json("/llmman/requests?" + requestQuery()),
      json("/llmman/stats?pool=1&window=" + encodeURIComponent($("f-since").value)), ...up.map(storedOn)]);
    view = { pool: pool.nodes, ps: ps.models, devices: {} };
    for (const n of devices.nodes) view.devices[n.address] = n.devices;
    showMain();
    renderNodes(pool.nodes, view.devices);
    renderPullNodes(pool.nodes);
    renderLoaded(ps.models || []);
    renderProgress(devices.nodes, ps.models || []);
    renderStored(stored.flat());
    renderRequests(requests.requests || []);
    renderStats(stats.stats || []);
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.ready = "1";
  } catch (e) {
    if (e instanceof Unauthorized) { showLogin(); return; }
    $("status").textContent = "update failed: " + e.message;
  }
  timer = setTimeout(refresh, POLL_MS);
}

function showMain() {
  $("login").classList.add("hidden");
  $("main").classList.remove("hidden");
  $("logout").classList.toggle("hidden", !sessionStorage.getItem(KEY));
}

function showLogin() {
  clearTimeout(timer);
  $("main").classList.add("hidden");
  $("login").classList.remove("hidden");
  $("status").textContent = "needs an API key";
  if (sessionStorage.getItem(KEY)) $("login-error").textContent = "that key was refused";
  sessionStorage.removeItem(KEY);
  $("login-key").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("login-key").value);
    $("login-key").value = "";
    $("login-error").textContent = "";
    refresh();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin(); });
  $("pull-form").addEventListener("submit", pull);
  $("filters").addEventListener("change", refresh);
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  refresh();
});
