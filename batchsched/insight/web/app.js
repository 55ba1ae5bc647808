// batchsched's web view: queues, jobs and GPU cards as the scheduler sees them.
//
// Read-only. Every 5 s it reads ../debug/queues, ../debug/jobs and ../debug/nodes
// (relative to the page, so it works behind `batchsched dashboard` or any proxy prefix)
// and redraws the three sections. A failed read (401/403 without a token, the scheduler
// gone) is shown as an error line above the last data that did load, never as a blank
// page. Text from the scheduler reaches the DOM only through textContent.
"use strict";

const REFRESH_MS = 5000;
const GPU = "nvidia.com/gpu";
const SOURCES = { queues: "../debug/queues", jobs: "../debug/jobs", nodes: "../debug/nodes" };

// the last answer of each endpoint, kept so a filter change redraws without a fetch
const data = { queues: null, jobs: null, nodes: null };

// -- formatting ---------------------------------------------------------------------------

// 45s, 12m, 3h 5m, 2d 4h
function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) {
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return m ? `${h}h ${m}m` : `${h}h`;
  }
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  return h ? `${d}d ${h}h` : `${d}d`;
}

// a number without trailing zeros: 8, 0.5, 1.25
function formatNumber(value) {
  if (value === null || value === undefined) return "—";
  return String(Math.round(value * 100) / 100);
}

function formatBytes(value) {
  const gi = value / 2 ** 30;
  return `${gi >= 10 ? Math.round(gi) : Math.round(gi * 10) / 10}Gi`;
}

function formatAmount(value, unit) {
  if (value === null || value === undefined) return "—";
  return unit === "bytes" ? formatBytes(value) : formatNumber(value);
}

// 2026-11-23 07:37:28, in the browser's time zone
function formatTime(epoch) {
  const t = new Date(epoch * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())} ${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`;
}

function shortName(resource) {
  if (resource === GPU) return "GPU";
  return resource.replace(/^.*\//, "");
}

// "in 12m" for a start estimate; its basis goes in the tooltip
function formatEstimate(estimate, now) {
  if (!estimate) return "—";
  let inSeconds = estimate.inSeconds;
  if ((inSeconds === null || inSeconds === undefined) && estimate.start !== null && estimate.start !== undefined) {
    inSeconds = estimate.start - now;
  }
  if (inSeconds === null || inSeconds === undefined) return "unknown";
  if (inSeconds < 1) return "now";
  return `in ${formatDuration(inSeconds)}`;
}

// -- DOM ----------------------------------------------------------------------------------

// el("td", {className: "num"}, "text", child, ...): strings become text nodes
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(text, kind, title) {
  return el("span", { className: `badge ${kind}`, title }, text);
}

// -- queues -------------------------------------------------------------------------------

// GPU first, then the rest by name
function orderedResources(resources) {
  return [...resources].sort((a, b) => (a.name === GPU ? -1 : b.name === GPU ? 1 : a.name.localeCompare(b.name)));
}

// one resource's bar: used within nominal, borrowed beyond it, lent out of it, the nominal marked
function quotaBar(r) {
  const nominal = r.nominal === null || r.nominal === undefined ? null : r.nominal;
  const borrowed = Math.max(0, r.borrowed || 0);
  const inNominal = Math.max(0, (r.used || 0) - borrowed);
  const lent = nominal === null ? 0 : Math.min(Math.max(0, r.lent || 0), Math.max(0, nominal - inNominal));
  const scale = Math.max(nominal || 0, inNominal + borrowed, inNominal + lent, 1e-9);
  const pct = (v) => `${(100 * v) / scale}%`;
  // without a nominal (a parent that only groups) there is nothing to fill: the text says it
  const bar = nominal === null ? el("div", { className: "bar none" }) : el("div", { className: "bar" },
    el("span", { className: "seg used", style: { width: pct(inNominal) } }),
    el("span", { className: "seg lent", style: { width: pct(lent) } }),
    el("span", { className: "seg borrowed", style: { width: pct(borrowed) } }));
  if (nominal !== null && nominal > 0) bar.append(el("span", { className: "nominal-mark", style: { left: pct(nominal) } }));

  const u = r.unit;
  let text = nominal === null ? `${formatAmount(r.used, u)} used, no quota` : `${formatAmount(r.used, u)} / ${formatAmount(nominal, u)}`;
  if (borrowed > 0) text += `, ${formatAmount(borrowed, u)} borrowed`;
  if ((r.lent || 0) > 0) text += `, ${formatAmount(r.lent, u)} lent`;
  if ((r.unavailable || 0) > 0) text += `, ${formatAmount(r.unavailable, u)} withheld (unhealthy nodes)`;
  const title = [
    `${r.name}${u ? ` (${u})` : ""}`,
    `used ${formatAmount(r.used, u)}`,
    `nominal ${nominal === null ? "none" : formatAmount(nominal, u)}`,
    `borrowed ${formatAmount(borrowed, u)}`,
    `lent ${formatAmount(r.lent || 0, u)}`,
    `withheld for unhealthy nodes ${formatAmount(r.unavailable || 0, u)}`,
    `borrowing limit ${r.borrowingLimit === null || r.borrowingLimit === undefined ? "none" : formatAmount(r.borrowingLimit, u)}`,
    `lending limit ${r.lendingLimit === null || r.lendingLimit === undefined ? "none" : formatAmount(r.lendingLimit, u)}`,
  ].join("\n");
  return el("div", { className: "quota", title },
    el("span", { className: "res" }, shortName(r.name)), bar, el("span", { className: "amount" }, text));
}

// the queues as a tree: each parent followed by its children (by name), with their depth
function treeOrder(queues) {
  const names = new Set(queues.map((q) => q.name));
  const children = new Map();
  for (const q of queues) {
    const parent = q.parent && names.has(q.parent) && q.parent !== q.name ? q.parent : "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(q);
  }
  const out = [], seen = new Set();
  const walk = (parent, depth) => {
    for (const q of (children.get(parent) || []).sort((a, b) => a.name.localeCompare(b.name))) {
      if (seen.has(q.name)) continue; // a cycle in the spec: shown once
      seen.add(q.name);
      out.push([q, depth]);
      walk(q.name, depth + 1);
    }
  };
  walk("", 0);
  for (const q of queues) if (!seen.has(q.name)) out.push([q, 0]);
  return out;
}

function renderQueues() {
  const body = document.querySelector("#queues tbody");
  const rows = treeOrder((data.queues && data.queues.queues) || []);
  body.replaceChildren(...rows.map(([q, depth]) => el("tr", { dataset: { queue: q.name } },
    el("td", { className: "name", style: { paddingLeft: `${0.5 + 1.2 * depth}em` }, title: q.parent ? `in ${q.parent}` : undefined }, q.name),
    el("td", {}, badge(q.state, `q-${q.state}`, q.message || undefined)),
    el("td", { className: "num pending" }, q.pending),
    el("td", { className: "num admitted" }, q.admitted),
    el("td", { className: "num", title: `weight ${formatNumber(q.weight)}` }, formatNumber(q.fairShare)),
    el("td", { className: "num" }, formatDuration(q.oldestWait)),
    el("td", { className: "quotas" }, ...orderedResources(q.resources || []).map(quotaBar)),
  )));
  if (!rows.length) body.append(el("tr", {}, el("td", { colSpan: 7, className: "muted" }, "no queues")));
  updateFilterChoices();
}

// -- jobs ---------------------------------------------------------------------------------

function updateFilterChoices() {
  const select = document.getElementById("queue-filter");
  const names = new Set(((data.queues && data.queues.queues) || []).map((q) => q.name));
  for (const j of (data.jobs && data.jobs.jobs) || []) if (j.queue) names.add(j.queue);
  const chosen = select.value;
  if (chosen) names.add(chosen);
  const want = ["", ...[...names].sort()];
  const have = [...select.options].map((o) => o.value);
  if (want.join("\n") === have.join("\n")) return;
  select.replaceChildren(...want.map((n) => el("option", { value: n }, n || "all queues")));
  select.value = chosen;
}

// waiting jobs first, by queue and their place in it; running jobs after them
function jobOrder(a, b) {
  const running = (j) => (j.state === "running" ? 1 : 0);
  const place = (j) => (j.position === null || j.position === undefined ? Infinity : j.position);
  return running(a) - running(b) || (a.queue || "").localeCompare(b.queue || "") ||
    place(a) - place(b) || `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`);
}

function renderJobs() {
  const body = document.querySelector("#jobs tbody");
  const all = (data.jobs && data.jobs.jobs) || [];
  const now = (data.jobs && data.jobs.now) || Date.now() / 1000;
  const chosen = document.getElementById("queue-filter").value;
  const rows = (chosen ? all.filter((j) => j.queue === chosen) : [...all]).sort(jobOrder);
  document.getElementById("job-count").textContent = chosen ? `${rows.length} of ${all.length} jobs` : `${all.length} jobs`;
  body.replaceChildren(...rows.map((j) => {
    const m = j.members || { bound: 0, required: 0, total: 0 };
    const est = j.estimate || null;
    const estTitle = est ? [est.basis, est.confidence && est.confidence !== "none" ? `confidence: ${est.confidence}` : null,
      est.start ? `at ${formatTime(est.start)}` : null].filter(Boolean).join("\n") || undefined : undefined;
    const running = j.state === "running";
    return el("tr", { className: `job ${j.state}`, dataset: { key: j.key } },
      el("td", { className: "name", title: `${j.kind}${j.api ? ` (${j.api})` : ""}, priority ${j.priority}` },
        el("span", { className: "muted" }, `${j.namespace}/`), j.name),
      el("td", { className: "queue" }, j.queue || "—", j.position ? el("span", { className: "muted", title: `${j.ahead || 0} job(s) ahead of it in its queue` },
        ` #${j.position}${j.queueLength ? ` of ${j.queueLength}` : ""}`) : null),
      el("td", {}, badge(j.state, `j-${j.state}`, [j.stateText, j.reason].filter(Boolean).join(": ") || undefined)),
      el("td", { className: "num", title: `${m.total} member(s) in all` }, `${m.bound}/${m.required}`),
      el("td", { className: "num" }, formatNumber(j.gpus)),
      el("td", { className: "num" }, running ? "—" : formatDuration(j.wait)),
      el("td", { className: "estimate", title: running ? undefined : estTitle }, running ? "—" : formatEstimate(est, now)),
      el("td", { className: "why" }, j.message || (running ? "" : j.stateText || "")),
    );
  }));
  if (!rows.length) body.append(el("tr", {}, el("td", { colSpan: 8, className: "muted" }, "no jobs")));
}

// -- nodes --------------------------------------------------------------------------------

function renderNodes() {
  const box = document.getElementById("nodes");
  const all = (data.nodes && data.nodes.nodes) || [];
  const withCards = all.filter((n) => (n.cards || []).length > 0);
  const rows = withCards.map((n) => {
    const marks = [];
    if (!n.ready) marks.push("not ready");
    if (!n.schedulable) marks.push("cordoned");
    const down = marks.length > 0;
    return el("div", { className: `node${down ? " down" : ""}`, dataset: { node: n.name } },
      el("span", { className: "node-name", title: n.name }, n.name),
      el("span", { className: "cards" }, ...n.cards.map((c) => {
        const used = Math.min(1, Math.max(0, c.used || 0));
        return el("span", { className: `card${used >= 1 ? " full" : used > 0 ? " part" : ""}`, title: `card ${c.index}: ${Math.round(used * 100)}% used` },
          el("span", { className: "fill", style: { height: `${used * 100}%` } }));
      })),
      el("span", { className: "node-used" }, `${formatNumber(n.gpusUsed)}/${n.gpus} used`),
      down ? badge(marks.join(", "), "node-down") : null,
    );
  });
  const skipped = all.length - withCards.length;
  if (skipped) rows.push(el("p", { className: "muted" }, `${skipped} node(s) without GPUs not shown`));
  if (!all.length) rows.push(el("p", { className: "muted" }, "no nodes"));
  box.replaceChildren(...rows);
}

// -- refresh ------------------------------------------------------------------------------

// what to do about a refused read
const HINTS = {
  401: "the scheduler wants a bearer token: open this page through `batchsched dashboard`, which adds your kubeconfig's token",
  403: "your user may not read them: it needs a ClusterRole that allows get on the nonResourceURLs /debug/*",
};

class ReadError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function read(name) {
  const url = SOURCES[name];
  let response;
  try {
    response = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ReadError(`${url} (${err.message || "unreachable"})`, 0);
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      if (body && body.error) detail = body.error;
    } catch (_) { /* not JSON: the status line says enough */ }
    throw new ReadError(`${url} (HTTP ${response.status}${detail ? `: ${detail}` : ""})`, response.status);
  }
  return response.json();
}

const RENDER = { queues: renderQueues, jobs: renderJobs, nodes: renderNodes };

async function refresh() {
  const names = Object.keys(SOURCES);
  const results = await Promise.allSettled(names.map(read));
  const failed = [], statuses = new Set(), broken = [];
  results.forEach((result, i) => {
    const name = names[i];
    if (result.status === "rejected") {
      failed.push(result.reason.message);
      statuses.add(result.reason.status);
      return;
    }
    data[name] = result.value;
    try {
      RENDER[name]();
    } catch (err) {
      broken.push(`could not show ${name}: ${err.message}`);
    }
  });
  if (data.queues && data.jobs) updateFilterChoices();
  const lines = [];
  if (failed.length) {
    const hints = [...statuses].map((s) => HINTS[s]).filter(Boolean);
    lines.push(`could not load ${failed.join(", ")}${hints.length ? `; ${hints.join("; ")}` : ""}`);
  }
  lines.push(...broken);
  const line = document.getElementById("error");
  line.textContent = lines.join(". ");
  line.hidden = lines.length === 0;
  const stamps = [data.queues, data.jobs, data.nodes].map((d) => d && d.now).filter(Boolean);
  document.getElementById("updated").textContent = stamps.length ? `data of ${formatTime(Math.max(...stamps))}` : "no data";
}

// the filter is kept in the address (?queue=Q), so a view of one queue can be linked
const filter = document.getElementById("queue-filter");
const linked = new URLSearchParams(location.search).get("queue");
if (linked) {
  filter.append(el("option", { value: linked }, linked));
  filter.value = linked;
}
filter.addEventListener("change", () => {
  const url = new URL(location.href);
  if (filter.value) url.searchParams.set("queue", filter.value);
  else url.searchParams.delete("queue");
  history.replaceState(null, "", url);
  renderJobs();
});
// the next refresh is timed from the end of the last one, so a slow answer never piles reads up
(async function loop() {
  await refresh();
  setTimeout(loop, REFRESH_MS);
})();
