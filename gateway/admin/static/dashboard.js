// Sluice dashboard: polls the admin JSON API once a second and draws it.  No framework, no
// build step; every value from the API is inserted as text (never as HTML).
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 300; // the budget chart spans the last five minutes
const COLORS = ["#3b6fd8", "#e07b39", "#2f9e6e", "#a24cc2", "#c9a227", "#d6455d", "#3aa6b9", "#7a8699"];

const state = {
  overview: null,
  history: new Map(), // service -> [[at, allocated_cores], ...] sorted by at
  now: null,
  colors: new Map(),
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.setAttribute("style", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: columns, class: "muted" }, empty))]));
}

const fmt = {
  cores: (v) => (v === null || v === undefined ? "–" : v.toFixed(2)),
  num: (v, d = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(d)),
  ms: (s) => (s === null || s === undefined ? "–" : (s * 1000).toFixed(0) + " ms"),
  age: (now, at) => (now === null ? "" : Math.max(0, now - at).toFixed(0) + "s ago"),
};

function colorOf(name) {
  if (!state.colors.has(name)) state.colors.set(name, COLORS[state.colors.size % COLORS.length]);
  return state.colors.get(name);
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (response.status === 404) return null; // e.g. no scaler in this gateway
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function record(service, at, cores) {
  if (at === null || cores === null) return;
  let series = state.history.get(service);
  if (!series) state.history.set(service, (series = []));
  if (series.length && series[series.length - 1][0] >= at) {
    if (series.some(([t]) => t === at)) return;
    series.push([at, cores]);
    series.sort((a, b) => a[0] - b[0]);
  } else {
    series.push([at, cores]);
  }
  while (series.length > 2 && series[1][0] < (state.now ?? at) - WINDOW_S) series.shift();
}

function valueAt(series, t) {
  let v = null;
  for (const [at, cores] of series) {
    if (at > t) break;
    v = cores;
  }
  return v;
}

function drawChart(names, budget) {
  const chart = document.getElementById("budget-chart");
  const W = 800, H = 200, now = state.now;
  const top = Math.max(budget, 0.001) * 1.15;
  const y = (c) => H - (c / top) * H;
  const shapes = [];
  if (now !== null) {
    // The last five minutes, or since the first decision seen when that is more recent.
    let earliest = now;
    for (const series of state.history.values()) if (series.length) earliest = Math.min(earliest, series[0][0]);
    const span = Math.min(WINDOW_S, Math.max(60, now - earliest));
    const from = now - span, steps = 200;
    const times = Array.from({ length: steps + 1 }, (_, i) => from + (i * span) / steps);
    const base = times.map(() => 0);
    for (const name of names) {
      const series = state.history.get(name) || [];
      const upper = times.map((t, i) => base[i] + (valueAt(series, t) ?? 0));
      const x = (i) => (i / steps) * W;
      const pts = upper.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
      const back = base.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).reverse();
      const poly = svg("polygon", { points: pts.concat(back).join(" "), fill: colorOf(name), "fill-opacity": "0.75", "data-service": name });
      poly.append(svg("title", {}));
      poly.lastChild.textContent = name;
      shapes.push(poly);
      upper.forEach((v, i) => (base[i] = v));
    }
    document.getElementById("chart-from").textContent = `−${Math.round(span)} s`;
  }
  const line = svg("line", { x1: 0, x2: W, y1: y(budget), y2: y(budget), stroke: "#c62828", "stroke-width": 2, "stroke-dasharray": "6 4" });
  const label = svg("text", { x: 6, y: y(budget) - 4, fill: "#c62828", "font-size": 12 });
  label.textContent = `budget ${budget} cores`;
  chart.replaceChildren(...shapes, line, label);
  document.getElementById("legend").replaceChildren(
    ...names.map((n) => el("span", {}, el("span", { class: "swatch", style: `background:${colorOf(n)}` }), n)),
    el("span", { class: "muted" }, "— budget (dashed); bars below: floor ▍ black, fair share ▍ red"),
  );
}

function renderShares(names, latest, budget) {
  const ov = state.overview.services;
  const rows = names.map((name) => {
    const d = latest[name];
    const alloc = d ? d.allocated_cores : null;
    const pct = (v) => `${Math.min(100, (100 * (v || 0)) / budget).toFixed(2)}%`;
    const bar = el("div", { class: "bar", title: `${name}: allocated ${fmt.cores(alloc)} of ${budget} cores` },
      el("div", { class: "fill", style: `width:${pct(alloc)};background:${colorOf(name)}` }),
      el("div", { class: "mark floor", style: `left:${pct(ov[name].floor_cores)}` }),
      el("div", { class: "mark fair", style: `left:${pct(ov[name].fair_share_cores)}` }));
    return el("tr", { "data-service": name },
      el("td", {}, name),
      el("td", { class: "num allocated" }, fmt.cores(alloc)),
      el("td", { class: "num" }, fmt.cores(ov[name].floor_cores)),
      el("td", { class: "num" }, fmt.cores(ov[name].fair_share_cores)),
      el("td", {}, bar));
  });
  fill(document.querySelector("#shares tbody"), rows, "no services", 5);
}

// Local platform: restarts and OOM kills under the replica counts (only when there were any).
function replicaTrouble(r) {
  if (!r || (!r.restarts_total && !r.oom_kills_total)) return [];
  const parts = [`${r.restarts_total} restarts`];
  if (r.oom_kills_total) parts.push(`${r.oom_kills_total} OOM kills`);
  return [el("div", { class: "muted" + (r.oom_kills_total ? " err" : "") }, parts.join(" · "))];
}

function replicaTitle(r) {
  if (!r) return "";
  const mem = r.memory_max_bytes ? `memory_max ${Math.round(r.memory_max_bytes / 1048576)} MiB` : "no memory_max";
  return `runs as ${r.user || "Sluice's user"} · ${mem}`;
}

function renderServices(names, services, latest) {
  const ov = state.overview.services;
  const rows = names.map((name) => {
    const s = services[name];
    const d = latest[name];
    const endpoints = s ? s.endpoints : [];
    const ready = endpoints.filter((e) => e.routable).length;
    const sig = s ? s.signals : {};
    const errors = sig.errors_total || 0;
    const routes = ov[name].routes.map((r) => (r.host ? r.host : "") + r.path + (r.path_type === "Prefix" ? "*" : ""));
    return el("tr", { "data-service": name },
      el("td", {}, el("strong", {}, name), el("div", { class: "muted" }, `${ov[name].mode} · ${ov[name].metric} ${ov[name].target}`)),
      el("td", {}, routes.join(" ")),
      el("td", { class: "num replicas", title: replicaTitle(s && s.replicas) }, `${d ? d.replicas : "–"} / ${ready}`, ...replicaTrouble(s && s.replicas)),
      el("td", { class: "num" }, d ? fmt.cores(d.cpu_per_replica_cores) : "–"),
      el("td", { class: "num rps" }, fmt.num(sig.rps)),
      el("td", { class: "num" }, sig.in_flight ?? "–"),
      el("td", { class: "num" }, sig.queued ?? "–"),
      el("td", { class: "num" }, fmt.ms(sig.latency_p99_s)),
      el("td", { class: "num" + (errors ? " err" : "") }, errors),
      el("td", { class: "endpoints" }, ...endpoints.map((e) =>
        el("span", { class: `badge ${e.ejected ? "ejected" : e.state}`, title: `${e.in_flight} in flight` }, `${e.address} ${e.ejected ? "ejected" : e.state}`))));
  });
  fill(document.querySelector("#services tbody"), rows, "no services", 10);
}

function explanationChips(explanation) {
  const chips = [];
  for (const c of explanation.clamps || []) {
    chips.push(el("span", { class: "chip clamp" }, `${c.name}: ${c.quantity} ${fmt.num(c.value, 2)} → ${fmt.num(c.bound, 2)}`));
  }
  for (const f of explanation.flows || []) {
    chips.push(el("span", { class: "chip flow" }, `${f.kind.replace(/_/g, " ")} ${fmt.cores(f.cores)} cores${f.peers.length ? " ↔ " + f.peers.join(", ") : ""}`));
  }
  return chips;
}

function renderDecisions(decisions, names) {
  const latest = decisions ? decisions.latest : {};
  const cards = names.filter((n) => latest[n]).map((name) => {
    const d = latest[name];
    const inputs = Object.entries(d.inputs || {}).map(([k, v]) => el("span", { class: "chip" }, `${k} ${typeof v === "number" ? fmt.num(v, 2) : v ?? "–"}`));
    return el("div", { class: "card decision", "data-service": name },
      el("h4", {}, `${name}: ${d.replicas} × ${fmt.cores(d.cpu_per_replica_cores)} cores`, el("span", { class: "muted" }, ` · ${d.rule}${d.frozen ? " · frozen" : ""}`)),
      el("div", {}, ...inputs),
      el("ol", { class: "reasons" }, ...d.reasons.map((r) => el("li", {}, r))),
      el("div", {}, ...explanationChips(d.explanation)));
  });
  const box = document.getElementById("latest-decisions");
  box.replaceChildren(...(cards.length ? cards : [el("p", { class: "muted" }, decisions ? "no decision yet" : "no scaler runs in this gateway")]));
  const recent = decisions ? decisions.recent.slice(0, 15) : [];
  const rows = recent.map((d) => el("tr", { "data-service": d.service },
    el("td", { class: "muted" }, fmt.age(state.now, d.at)),
    el("td", {}, d.service),
    el("td", {}, `${d.replicas} × ${fmt.cores(d.cpu_per_replica_cores)} = ${fmt.cores(d.allocated_cores)} cores`),
    el("td", {}, d.rule),
    el("td", {}, el("details", {}, el("summary", {}, d.reasons[d.reasons.length - 1] || ""), el("ol", {}, ...d.reasons.map((r) => el("li", {}, r)))))));
  fill(document.querySelector("#recent-decisions tbody"), rows, "no change yet", 5);
}

function renderTraces(traces) {
  const list = traces ? traces.traces : [];
  const rows = list.map((t) => el("tr", { class: t.status === "error" ? "err" : "" },
    el("td", { class: "muted" }, new Date(t.start_unix_nano / 1e6).toLocaleTimeString()),
    el("td", {}, t.root),
    el("td", {}, t.services.join(", ")),
    el("td", { class: "num" }, `${t.duration_ms.toFixed(1)} ms`),
    el("td", { class: "num" }, t.span_count),
    el("td", {}, t.status)));
  const off = traces && traces.buffer.tracing === "off";
  fill(document.querySelector("#traces tbody"), rows, off ? "tracing is off (telemetry.tracing)" : "no trace yet", 6);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const [overview, services, decisions, traces] = await Promise.all([
      getJSON("api/overview"),
      getJSON("api/services"),
      getJSON("api/decisions?limit=256"),
      getJSON("api/traces?kind=request&limit=10"),
    ]);
    state.overview = overview;
    state.now = decisions ? decisions.at : services.at;
    const names = Object.keys(overview.services).sort();
    const latest = decisions ? decisions.latest : {};
    if (decisions) {
      for (const d of decisions.recent) record(d.service, d.at, d.allocated_cores);
      for (const d of Object.values(latest)) record(d.service, d.at, d.allocated_cores);
    }
    const budget = overview.budget.cpu;
    const allocated = decisions ? decisions.budget.allocated_cores : null;
    document.getElementById("version").textContent = "v" + overview.version;
    document.getElementById("platform").textContent = overview.platform;
    document.getElementById("budget-summary").textContent =
      `budget ${budget} cores (${overview.budget.arbitration}, ${overview.budget.enforcement})` +
      (allocated === null ? "" : ` · allocated ${fmt.cores(allocated)}`);
    drawChart(names, budget);
    renderShares(names, latest, budget);
    renderServices(names, services.services, latest);
    renderDecisions(decisions, names);
    renderTraces(traces);
    status.dataset.state = "live";
    status.textContent = "live · " + new Date().toLocaleTimeString();
  } catch (error) {
    status.dataset.state = "error";
    status.textContent = "not updating: " + error.message;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
