// The cronoq dashboard: polls /api/overview about once a second and draws it. No framework, no build step.
// Everything a broker reports (tenant names, error messages, tracebacks) goes into the page as text, never as
// markup. The token lives in sessionStorage: this tab only, gone when it closes.
"use strict";

const TOKEN_KEY = "cronoq-token";
const ACTION_HEADER = "X-Cronoq-Dashboard";
const state = { overview: null, view: "pools", pool: null, interval: 1.0, mayAct: false, timer: null,
  history: null, historyAt: 0, drawn: null };
const SVG = "http://www.w3.org/2000/svg";
// One color per followed tenant (the broker follows at most 8 per pool): its share solid, its weighted share dashed.
// Orange comes late: the table's bars use it for the weighted share.
const COLORS = ["#2f6fed", "#2b8a3e", "#9c36b5", "#c2255c", "#0b7285", "#e8590c", "#5c940d", "#495057"];

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, method = "GET") {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  if (method !== "GET") headers[ACTION_HEADER] = "1";
  const response = await fetch(path, { method, headers, cache: "no-store" });
  const text = await response.text();
  let body = null;
  try { body = JSON.parse(text); } catch (e) { body = null; }
  if (!response.ok) {
    const error = body && body.error ? body.error : { code: String(response.status), message: text };
    throw new ApiError(response.status, error.code, error.message);
  }
  return body;
}

// el("td", {class: "x"}, "text", child...): an element with attributes and text or element children.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function $(id) { return document.getElementById(id); }
const percent = (x) => (x === null || x === undefined) ? "–" : (100 * x).toFixed(1) + " %";
const number = (x) => Number(x).toLocaleString("en-US");
// A lag to one decimal with its sign; one that rounds to zero is plain 0.0 (not -0.0).
const signed = (x) => Math.abs(x) < 0.05 ? "0.0" : (x > 0 ? "+" : "") + x.toFixed(1);

function replaceRows(tbody, rows) { tbody.replaceChildren(...rows); }

// ------------------------------------------------------------------ session

function showLogin(message) {
  $("views").hidden = true;
  $("login").hidden = false;
  $("token-error").textContent = message || "";
  $("token-input").focus();
}

async function openSession() {
  try {
    const session = await api("/api/session");
    state.mayAct = session.may_act;
    state.interval = session.interval || 1.0;
    $("role").textContent = (!session.auth ? "open broker (no tokens)"
      : session.role === "admin" ? "admin" : "viewer (read-only)")
      + (session.tenant ? " of " + session.tenant + " only" : "");
    $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
    $("login").hidden = true;
    $("views").hidden = false;
    poll();
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      const hadToken = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(hadToken ? error.message : "");
    } else {
      $("updated").textContent = "cannot reach the broker: " + error.message;
      setTimeout(openSession, 2000);
    }
  }
}

// ------------------------------------------------------------------ polling

async function poll() {
  clearTimeout(state.timer);
  try {
    state.overview = await api("/api/overview");
    await fetchHistory();
    render();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("updated").classList.remove("stale");
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(error.message);
      return;  // no more polling until a token is given
    }
    $("updated").textContent = "not updated: " + error.message;
    $("updated").classList.add("stale");
  }
  state.timer = setTimeout(poll, state.interval * 1000);
}

// The shares over time change once per sample (a few seconds): asked for only while the tenants view shows, and
// only once a new sample can be there.
async function fetchHistory() {
  if (state.view !== "tenants" || !state.pool) return;
  const due = state.history && state.history.pool === state.pool
    ? state.historyAt + 1000 * (state.history.interval || 2) : 0;
  if (Date.now() < due) return;
  try {
    state.history = (await api("/api/history/" + encodeURIComponent(state.pool))).pools[state.pool];
  } catch (error) {
    state.history = { pool: state.pool, points: [], error: error.message };
  }
  state.historyAt = Date.now();
}

function render() {
  const o = state.overview;
  if (!o) return;
  renderPools(o);
  renderTenants(o);
  renderChart();
  renderWorkers(o);
  renderFailures(o);
}

function renderPools(o) {
  replaceRows($("pools").querySelector("tbody"), o.pools.map((p) => {
    const flags = [p.paused ? "paused" : "running", p.draining ? "draining" : null, p.fair ? "fair" : null,
      p.share_by && p.share_by !== "dispatches" ? "shares by " + p.share_by : null];
    const action = p.paused ? "resume" : "pause";
    return el("tr", { "data-pool": p.name, class: p.paused ? "paused" : null },
      el("td", { class: "name" }, p.name),
      el("td", { class: "state" }, flags.filter(Boolean).join(", ")),
      el("td", { class: "queued num" }, number(p.queued)),
      el("td", { class: "delayed num" }, number(p.delayed)),
      el("td", { class: "running num" },
        number(p.running) + (p.max_in_flight ? " / " + number(p.max_in_flight) : "")),
      el("td", { class: "rate num" }, p.dispatch_rate.toFixed(1)),
      el("td", { class: "workers num" }, number(p.workers)),
      el("td", { class: "tenants num" }, number(p.tenant_count)),
      el("td", {}, state.mayAct
        ? el("button", { type: "button", class: action, onclick: () => poolAction(p.name, action) }, action)
        : null));
  }));
}

function renderTenants(o) {
  const select = $("tenant-pool");
  const names = o.pools.map((p) => p.name);
  if (select.options.length !== names.length || names.some((n, i) => select.options[i].value !== n)) {
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  if (!names.includes(state.pool)) {
    // The fair pool with the most tenants, else the pool with the most tenants.
    const ranked = [...o.pools].sort((a, b) => (b.fair - a.fair) || (b.tenant_count - a.tenant_count));
    state.pool = ranked.length ? ranked[0].name : null;
  }
  select.value = state.pool;
  const pool = o.pools.find((p) => p.name === state.pool);
  $("share-window").textContent = o.share_window === null ? "(since the broker started)"
    : "(last " + o.share_window.toFixed(0) + " s)";
  if (!pool) { replaceRows($("tenants").querySelector("tbody"), []); return; }
  replaceRows($("tenants").querySelector("tbody"), pool.tenants.map((t) => {
    const actual = el("div", { class: "bar actual" });
    actual.style.width = (100 * t.share).toFixed(1) + "%";
    const promised = el("div", { class: "bar promised" });
    promised.style.width = (100 * (t.weighted_share || 0)).toFixed(1) + "%";
    const label = el("td", { class: "name" }, t.label);
    label.style.paddingLeft = (0.5 + 1.5 * t.depth) + "em";
    const limits = [];
    if (t.ceiling) {
      limits.push(number(t.ceiling.running) + " / " + number(t.ceiling.limit)
        + (t.ceiling.capped ? " (at its ceiling)" : ""));
    }
    if (t.rate) {
      limits.push(t.rate.rate + "/s" + (t.rate.limited
        ? " (rate-limited: next start in " + (t.rate.next_start_in || 0).toFixed(1) + " s)" : ""));
    }
    if (t.minimum) {
      limits.push("minimum " + number(t.minimum.minimum)
        + (t.minimum.under ? " (under it: " + number(t.minimum.running) + " running, goes first)" : ""));
    }
    const ceiling = limits.join("; ");
    const unit = { cost: " cost", seconds: " s" }[pool.share_unit] || "";
    return el("tr", { "data-tenant": t.tenant, class: t.depth ? "child" : null },
      label,
      el("td", { class: "bars" }, actual, pool.fair ? promised : null),
      el("td", { class: "share num" }, percent(t.share)),
      el("td", { class: "weighted num" }, pool.fair ? percent(t.weighted_share) : "first come"),
      el("td", { class: "weight num" }, t.weight),
      el("td", { class: "lag num" }, signed(t.lag) + unit),
      el("td", { class: "queued num" }, number(t.queued)),
      el("td", { class: "running num" }, number(t.running)),
      el("td", { class: "ceiling" }, ceiling));
  }));
  const leaves = pool.tenants.length;
  $("tenants-more").textContent = pool.tenant_count > leaves
    ? "The most active tenants of " + number(pool.tenant_count) + " are shown." : "";
}

function renderWorkers(o) {
  $("worker-count").textContent = "(" + number(o.workers_connected) + ")";
  replaceRows($("workers").querySelector("tbody"), o.workers.map((w) =>
    el("tr", { "data-worker": w.name },
      el("td", { class: "name" }, w.name),
      el("td", { class: "pools" }, w.pools.join(", ")),
      el("td", { class: "slots num" }, (w.busy === null ? "–" : w.busy) + " / " + w.concurrency),
      el("td", { class: "seen num" }, w.last_seen.toFixed(1) + " s ago"),
      el("td", {}, w.leaving ? "leaving" : ""))));
}

function renderFailures(o) {
  replaceRows($("failures").querySelector("tbody"), o.failures.map((f) =>
    el("tr", { "data-task": f.id, class: "clickable", onclick: () => showTraceback(f.id) },
      el("td", { class: "id mono" }, f.id),
      el("td", {}, f.pool),
      el("td", {}, f.tenant === null ? "(none)" : f.tenant),
      el("td", { class: "error-type" }, f.error_type),
      el("td", { class: "message" }, f.message),
      el("td", { class: "num" }, f.attempts),
      el("td", {}, f.finished_at ? new Date(f.finished_at * 1000).toLocaleTimeString() : ""))));
}

// ------------------------------------------------------------------ shares over time

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// Polylines through the points whose value is known: a gap (a tenant not followed then, no dispatches) breaks it.
function lines(points, x, y, value, attrs) {
  const out = [];
  let run = [];
  const flush = () => {
    if (run.length > 1) out.push(svg("polyline", { ...attrs, points: run.join(" ") }));
    run = [];
  };
  for (const p of points) {
    const v = value(p);
    if (v === null || v === undefined) { flush(); continue; }
    run.push(x(p.at).toFixed(1) + "," + y(v).toFixed(1));
  }
  flush();
  return out;
}

function renderChart() {
  const box = $("share-chart");
  const h = state.history;
  if (!h || h.pool !== state.pool) { box.replaceChildren(); state.drawn = null; return; }
  if (h === state.drawn) return;  // redrawn only when a new sample came: a chart that flickers each second is hard to read
  state.drawn = h;
  if (h.error) { box.replaceChildren(el("p", { class: "note" }, "shares over time: " + h.error)); return; }
  const points = h.points;
  if (!points.length) {
    box.replaceChildren(el("p", { class: "note" }, "Shares over time appear after the first samples (every "
      + (h.interval || 2) + " s)."));
    return;
  }
  const W = 720, H = 170, RH = 70, left = 44, right = 10, top = 8, bottom = 18;
  const end = points[points.length - 1].at, start = end - (h.window || 600);
  const x = (t) => left + (W - left - right) * Math.max(0, t - start) / (end - start);
  const y = (v) => top + (H - top - bottom) * (1 - Math.max(0, Math.min(1, v)));
  const share = svg("svg", { viewBox: "0 0 " + W + " " + H, class: "chart", role: "img",
    "aria-label": "each tenant's share of dispatches over time, against its weighted share" });
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    share.append(svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" }, (100 * v) + " %"));
  }
  for (const [label, t] of [["−10 min", start], ["−5 min", start + (end - start) / 2], ["now", end]]) {
    share.append(svg("text", { x: x(t), y: H - 4, "text-anchor": t === start ? "start" : t === end ? "end" : "middle",
      class: "axis" }, label));
  }
  const names = [...new Set(points.flatMap((p) => Object.keys(p.tenants)))].sort();
  const legend = [];
  names.forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const of = (field) => (p) => p.tenants[name] ? p.tenants[name][field] : null;
    if (h.fair) {
      share.append(...lines(points, x, y, of("weighted_share"),
        { stroke: color, "stroke-dasharray": "5 4", class: "promised-line", "data-tenant": name }));
    }
    share.append(...lines(points, x, y, of("share"), { stroke: color, class: "share-line", "data-tenant": name }));
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = color;
    legend.push(el("span", { class: "series" }, swatch, name === "" ? "(none)" : name));
  });
  const maxRate = Math.max(1, ...points.map((p) => p.rate));
  const ry = (v) => top + (RH - top - bottom) * (1 - v / maxRate);
  const rate = svg("svg", { viewBox: "0 0 " + W + " " + RH, class: "chart rate", role: "img",
    "aria-label": "the pool's dispatches per second over time" });
  rate.append(svg("line", { x1: left, x2: W - right, y1: ry(0), y2: ry(0), class: "grid" }),
    svg("line", { x1: left, x2: W - right, y1: ry(maxRate), y2: ry(maxRate), class: "grid" }),
    svg("text", { x: left - 6, y: ry(maxRate) + 4, "text-anchor": "end", class: "axis" }, maxRate.toFixed(0) + "/s"),
    svg("text", { x: left - 6, y: ry(0) + 4, "text-anchor": "end", class: "axis" }, "0"),
    ...lines(points, x, ry, (p) => p.rate, { class: "rate-line" }));
  const last = points[points.length - 1];
  box.replaceChildren(
    el("h3", {}, "Shares over the last 10 minutes"),
    el("p", { class: "legend" }, "Solid: each tenant's share of the pool's dispatches (over about 10 s at each point);"
      + (h.fair ? " dashed: the share its weight promises." : " this pool serves first come, first served.")),
    share, el("p", { class: "legend series-legend" }, ...legend),
    el("h3", {}, "Dispatches per second ", el("span", { id: "rate-now", class: "note" }, "(now " + last.rate.toFixed(1) + ")")),
    rate);
}

// ------------------------------------------------------------------ actions and lookups

async function poolAction(pool, action) {
  $("action-error").textContent = "";
  try {
    await api("/api/pools/" + encodeURIComponent(pool) + "/" + action, "POST");
  } catch (error) {
    $("action-error").textContent = action + " " + pool + ": " + error.message;
  }
  poll();
}

async function showTraceback(id) {
  const box = $("traceback");
  try {
    const failure = await api("/api/failures/" + encodeURIComponent(id));
    box.textContent = "task " + failure.id + " — " + failure.error_type + ": " + failure.message + "\n\n"
      + (failure.traceback || "(no traceback)");
  } catch (error) {
    box.textContent = error.message;
  }
  box.hidden = false;
}

async function lookUpTask(id) {
  const view = $("task-view");
  try {
    const task = await api("/api/tasks/" + encodeURIComponent(id));
    const rows = [["id", task.id], ["state", task.state], ["attempts", task.attempts], ["pool", task.pool],
      ["tenant", task.tenant === null ? "(none)" : task.tenant], ["priority", task.priority],
      ["submitted", when(task.submitted_at)], ["started", when(task.started_at)],
      ["finished", when(task.finished_at)], ["deadline", when(task.deadline)], ["error", task.error || ""]];
    const parts = [el("table", { class: "task" }, ...rows.map(([k, v]) =>
      el("tr", { "data-field": k }, el("th", {}, k), el("td", {}, v))))];
    if (task.traceback) parts.push(el("pre", { class: "task-traceback" }, task.traceback));
    if (task.explain !== undefined) {
      parts.push(el("h3", {}, "Why it is where it is"),
        el("pre", { class: "explain" }, task.explain_text || JSON.stringify(task.explain, null, 2)));
    }
    if (state.mayAct && (task.state === "queued" || task.state === "delayed")) {
      parts.push(el("button", { type: "button", id: "task-cancel", onclick: () => cancelTask(task.id) }, "Cancel"));
    }
    view.replaceChildren(...parts);
  } catch (error) {
    view.replaceChildren(el("p", { class: "error" }, error.message));
  }
}

function when(stamp) { return stamp ? new Date(stamp * 1000).toLocaleString() : ""; }

async function cancelTask(id) {
  try {
    const answer = await api("/api/tasks/" + encodeURIComponent(id) + "/cancel", "POST");
    if (!answer.cancelled) $("action-error").textContent = "task " + id + " could not be cancelled: it is no longer waiting";
  } catch (error) {
    $("action-error").textContent = "cancel " + id + ": " + error.message;
  }
  lookUpTask(id);
}

// ------------------------------------------------------------------ wiring

function showView(view) {
  state.view = view;
  for (const button of $("tabs").querySelectorAll("button")) {
    button.classList.toggle("active", button.dataset.view === view);
  }
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== "view-" + view;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of $("tabs").querySelectorAll("button")) {
    // replaceState, not location.hash: a hash jumps to the element of that id (the tables are #pools, #tenants...),
    // scrolling the tab bar out of sight.
    button.addEventListener("click", () => {
      showView(button.dataset.view);
      history.replaceState(null, "", "#" + button.dataset.view);
      if (button.dataset.view === "tenants") fetchHistory().then(render);
    });
  }
  const fromHash = location.hash.slice(1);
  if (["pools", "tenants", "workers", "failures", "task"].includes(fromHash)) showView(fromHash);
  $("tenant-pool").addEventListener("change", (event) => { state.pool = event.target.value; render(); fetchHistory().then(render); });
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
    $("token-input").value = "";
    openSession();
  });
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(state.timer);
    location.reload();
  });
  $("task-form").addEventListener("submit", (event) => { event.preventDefault(); lookUpTask($("task-id").value.trim()); });
  openSession();
});
