// memest's page: the job form, the estimate from POST /v1/estimate drawn as a stacked SVG bar against the
// device's capacity and usable line, the sweep from POST /v1/sweep drawn as stacked areas across the range of
// one slider, and the same settings in the address so a link reproduces the view; a pasted log checked by
// POST /v1/check (memest check) drawn as a table of logged vs memest per figure. The catalogs, devices and
// training stacks come from GET /v1/models, /v1/gpus and /v1/stacks. Request fields are the Python API's
// keyword names; nothing here is loaded from the network.
"use strict";

const GiB = 2 ** 30;
const SLIDERS = ["micro_batch_size", "seq_len", "max_model_len", "batch_size"];
const TRAINING = ["seq_len", "micro_batch_size"];
const SERVING = ["max_model_len", "batch_size"];
const COLORS = ["#0b5cad", "#e8710a", "#1a7f37", "#a142f4", "#d93025", "#12a4af", "#8d6e63", "#f4b400",
                "#5f6368", "#c2185b"];
const CLIP = 3;  // the sweep chart's height: at most this many times the device's capacity
const $ = (id) => document.getElementById(id);
let models = {};
let stacks = {};
let seq = 0;
let timer = null;

function gib(n) { return (n / GiB).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + " GiB"; }
function tokens(n) { return n >= 1024 && n % 1024 === 0 ? (n / 1024) + "k" : String(n); }
function sliderValue(id) { return 2 ** Number($(id).value); }
function isServing() { return $("mode").value === "serve"; }

function shown(id, value) { return id === "seq_len" || id === "max_model_len" ? tokens(value) : String(value); }
function sliderLabel(id) { return document.querySelector(`label[for=${id}]`).firstChild.textContent.trim(); }

function showSliders() {
  for (const el of document.querySelectorAll("#job .serve, #job .train")) {
    el.hidden = el.classList.contains("serve") !== isServing();
  }
  for (const id of SLIDERS) $(id + "-out").textContent = shown(id, sliderValue(id));
  fillSweepChoices();
}

// the sweep picker offers the sliders of the mode; a choice that the mode has not is replaced by its first
function fillSweepChoices() {
  const pick = $("sweep");
  const ids = isServing() ? SERVING : TRAINING;
  const wanted = pick.dataset.wanted || pick.value;
  if ([...pick.options].map((o) => o.value).join() !== ids.join()) {
    pick.replaceChildren(...ids.map((id) => {
      const o = document.createElement("option");
      o.value = id; o.textContent = sliderLabel(id);
      return o;
    }));
  }
  if (ids.includes(wanted)) pick.value = wanted;
  delete pick.dataset.wanted;
}

function pastedConfig() {
  const text = $("config").value.trim();
  if (!text) return null;
  try { return JSON.parse(text); } catch (e) { throw new Error("the pasted config.json is not JSON: " + e.message); }
}

function request() {
  const body = {};
  const config = pastedConfig();
  if (config !== null) body.config = config; else body.model = $("model").value.trim();
  body.mode = $("mode").value;
  if (!isServing() && $("stack").value) body.stack = $("stack").value;
  if ($("gpu").value) body.gpu = $("gpu").value;
  const count = Number($("gpus").value);
  if (count > 1) body.gpus = count;
  for (const id of isServing() ? SERVING : TRAINING) body[id] = sliderValue(id);
  return body;
}

function writeAddress(body) {
  const q = new URLSearchParams();
  if (body.model) q.set("model", body.model);
  for (const key of ["mode", "stack", "gpu", "gpus", ...SLIDERS]) if (body[key] !== undefined) q.set(key, body[key]);
  q.set("sweep", $("sweep").value);
  history.replaceState(null, "", "?" + q.toString());
}

function readAddress() {
  const q = new URLSearchParams(location.search);
  if (q.get("model")) $("model").value = q.get("model");
  if (q.get("mode")) $("mode").value = q.get("mode");
  if (q.get("gpu")) $("gpu").dataset.wanted = q.get("gpu");
  if (q.get("stack")) $("stack").dataset.wanted = q.get("stack");
  if (q.get("sweep")) $("sweep").dataset.wanted = q.get("sweep");
  if (q.get("gpus")) $("gpus").value = q.get("gpus");
  for (const id of SLIDERS) {
    const v = Number(q.get(id));
    if (v > 0) $(id).value = Math.round(Math.log2(v));
  }
}

function fitContextSlider() {
  const m = models[$("model").value.trim()];
  const ctx = m && m.max_position_embeddings ? m.max_position_embeddings : 2 ** 17;
  const top = Math.max(9, Math.floor(Math.log2(ctx)));
  for (const id of ["max_model_len", "seq_len"]) {
    $(id).max = top;
    if (Number($(id).value) > top) $(id).value = top;
  }
  $("model-hint").textContent = m ? `${m.model_type}, ${(m.num_params / 1e9).toFixed(2)} B parameters, ` +
    `${m.num_layers} layers, context ${m.max_position_embeddings ? m.max_position_embeddings.toLocaleString("en-US") : "-"}` : "";
}

function schedule() {
  showSliders();
  clearTimeout(timer);
  timer = setTimeout(update, 120);
}

async function post(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}

async function update() {
  const mine = ++seq;
  let body;
  try { body = request(); } catch (e) { showError(e.message); return; }
  if (!body.model && !body.config) return;
  writeAddress(body);
  updateSweep(body);
  $("result").setAttribute("aria-busy", "true");
  try {
    const [estimate, command] = await Promise.all([post("/v1/estimate", body), post("/v1/command", body)]);
    if (mine !== seq) return;  // a newer request is on its way
    showError("");
    render(estimate, command.command);
  } catch (e) {
    if (mine === seq) showError(e.message);
  } finally {
    if (mine === seq) $("result").setAttribute("aria-busy", "false");
  }
}

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message ? "Error: " + message : "";
  if (message) {
    $("verdict").textContent = "No estimate."; $("verdict").className = "verdict";
    $("job-line").textContent = "";
  }
}

function svg(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function drawBar(terms, capacity, usable) {
  const bar = $("bar");
  for (const el of [...bar.children]) if (el.tagName !== "title") el.remove();
  const width = Math.max(Math.round(bar.getBoundingClientRect().width), 200);  // user units = pixels: text keeps its shape
  bar.setAttribute("viewBox", `0 0 ${width} 120`);
  const total = terms.reduce((s, t) => s + t.bytes, 0);
  const scale = width / (Math.max(total, capacity) * 1.04 || 1);
  let x = 0;
  const legend = $("legend");
  legend.replaceChildren();
  terms.forEach((t, i) => {
    const w = t.bytes * scale;
    const rect = svg("rect", { x: x.toFixed(2), y: 30, width: Math.max(w, 0).toFixed(2), height: 60,
                               fill: COLORS[i % COLORS.length], "data-term": t.name });
    rect.appendChild(svg("title", {}, `${t.name}: ${gib(t.bytes)}`));
    bar.appendChild(rect);
    x += w;
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch"; sw.style.background = COLORS[i % COLORS.length];
    li.append(sw, `${t.name} ${gib(t.bytes)}`);
    legend.appendChild(li);
  });
  for (const [bytes, label, color, y] of [[capacity, "capacity " + gib(capacity), "#1b1f24", 14],
                                          [usable, "usable " + gib(usable), "#b3261e", 112]]) {
    if (!bytes) continue;
    const lx = bytes * scale;
    bar.appendChild(svg("line", { x1: lx, x2: lx, y1: 20, y2: 100, stroke: color, "stroke-width": 3,
                                  "stroke-dasharray": label.startsWith("usable") ? "6 4" : "", "data-line": label.split(" ")[0] }));
    const anchor = lx > width * 0.7 ? "end" : "start";
    bar.appendChild(svg("text", { x: lx + (anchor === "end" ? -4 : 4), y, "font-size": 13, fill: color,
                                  "text-anchor": anchor }, label));
  }
}

let last = null;
window.addEventListener("resize", () => { if (last) drawBar(...last); drawSweep(); });

// the training stack whose defaults the estimate used, and the settings they filled
function jobLine(w) {
  if (!w || !w.stack) return "";
  const s = stacks[w.stack];
  const why = w.stack_assumed ? `assumed: ${w.stack_assumed}` : "picked";
  return `Stack ${s ? s.label : w.stack} (${why}): precision ${w.precision}, optimizer ${w.optimizer}, ` +
         `activation checkpointing ${w.recompute}, attention ${w.attn_implementation}, loss ${w.loss}.`;
}

function render(e, command) {
  const pd = e.per_device;
  const v = $("verdict");
  const where = `${e.device.count} × ${e.device.name}`;
  const c = e.concurrency;
  v.textContent = e.fits ? `Fits on ${where}: ${gib(e.margin_bytes)} to spare`
                : e.verdict === "queues"
                ? `Starts on ${where}: holds ${c.held.toLocaleString("en-US")} of ${c.asked.toLocaleString("en-US")} ` +
                  `concurrent sequences at ${c.tokens.toLocaleString("en-US")} tokens (the rest wait)`
                : `Does not fit on ${where}: ${gib(-e.margin_bytes)} over` + (e.fit_blocker ? ` (${e.fit_blocker})` : "");
  v.className = "verdict " + (e.fits ? "fits" : e.verdict === "queues" ? "queues" : "nofit");
  $("band").textContent = `Device used ${gib(pd.device_used_bytes)} (band ${gib(pd.low_bytes)} – ${gib(pd.high_bytes)}); ` +
    `peak allocated ${gib(pd.allocated_bytes)}, reserved ${gib(pd.reserved_bytes)}; usable ${gib(e.usable_bytes)} ` +
    `of ${gib(e.device.memory_bytes)}.`;
  $("job-line").textContent = jobLine(e.workload);
  last = [e.terms, e.device.memory_bytes, e.usable_bytes];
  drawBar(...last);
  const rec = $("recommendation");
  rec.replaceChildren();
  const r = e.recommendation || {};
  for (const [key, label] of [["cheapest", "Cheapest change that fits"], ["lossless", "Lossless change that fits"]]) {
    if (!r[key]) continue;
    const p = document.createElement("p");
    const c = document.createElement("code");
    c.textContent = r[key].flags;
    p.append(`${label}: `, c, ` (${r[key].devices} device${r[key].devices > 1 ? "s" : ""}, ${gib(r[key].device_used_bytes)} used)`);
    rec.appendChild(p);
  }
  if (!e.fits && e.verdict !== "queues" && !r.cheapest && !r.lossless) rec.textContent = "No change within the search fits; try memest plan.";
  $("command").value = command;
}

function showStack() {
  const s = stacks[$("stack").value];
  $("stack-hint").textContent = s ? `Its defaults: ${s.recipe}. Settings given override them.` : "";
}

// ---- the sweep: POST /v1/sweep over the picked slider's whole range, the other settings as they are ----

let sweepData = null;
let sweepKey = null;
let sweepSeq = 0;

function sweepBody(body) {
  const id = $("sweep").value;
  return { ...body, [id]: `${2 ** Number($(id).min)}..${2 ** Number($(id).max)}` };
}

async function updateSweep(body) {
  const wanted = sweepBody(body);
  const key = JSON.stringify(wanted);
  if (key === sweepKey) { drawSweep(); return; }  // only the swept slider moved: the marker follows it
  const mine = ++sweepSeq;
  sweepKey = key;
  $("sweep-panel").setAttribute("aria-busy", "true");
  try {
    const data = await post("/v1/sweep", wanted);
    if (mine !== sweepSeq) return;
    sweepData = data;
    showSweepError("");
  } catch (e) {
    if (mine !== sweepSeq) return;
    sweepKey = null;
    sweepData = null;
    showSweepError(e.message);
  } finally {
    if (mine === sweepSeq) $("sweep-panel").setAttribute("aria-busy", "false");
  }
  drawSweep();
}

function showSweepError(message) {
  $("sweep-error").hidden = !message;
  $("sweep-error").textContent = message ? "Error: " + message : "";
}

function niceStep(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= x);
}

// per point, bytes by term kind; the kinds in the order they first appear
function byKind(points) {
  const kinds = [];
  const rows = points.map((p) => {
    const row = {};
    for (const t of p.terms || []) {
      if (!kinds.includes(t.kind)) kinds.push(t.kind);
      row[t.kind] = (row[t.kind] || 0) + t.bytes;
    }
    return row;
  });
  return [kinds, rows];
}

function sweepSummary(s, label) {
  const q = s.largest;
  const first = s.points.length ? shown(s.setting, s.points[0].value) : "";
  if (!q || q.value === null) return `Nothing fits on ${s.device.count} × ${s.device.name}: not even ${label} ${first}.`;
  if (q.limit !== "memory") return `Largest ${label} that fits: ${q.value.toLocaleString("en-US")}, the most the estimator accepts (${q.limit}).`;
  return `Largest ${label} that fits on ${s.device.count} × ${s.device.name}: ${q.value.toLocaleString("en-US")}` +
         (q.capped ? " (the search cap; larger may fit)." : `; ${(q.value + q.step).toLocaleString("en-US")} does not.`);
}

function pickPoint(id, value) {
  $(id).value = Math.round(Math.log2(value));
  schedule();
}

function drawSweep() {
  const chart = $("sweep-chart");
  const focused = chart.contains(document.activeElement) ? document.activeElement.getAttribute("data-value") : null;
  for (const el of [...chart.children]) if (el.tagName !== "title") el.remove();
  const s = sweepData;
  const legend = $("sweep-legend");
  legend.replaceChildren();
  $("sweep-table").replaceChildren();
  $("sweep-summary").textContent = "";
  if (!s || !s.points.length) return;
  const id = s.setting;
  const label = sliderLabel(id);
  $("sweep-summary").textContent = sweepSummary(s, label);
  const width = Math.max(Math.round(chart.getBoundingClientRect().width), 240);  // user units = pixels
  const height = 280;
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const [L, R, T, B] = [64, 16, 16, 44];
  const pw = width - L - R;
  const ph = height - T - B;
  const points = s.points.filter((p) => !p.error);
  const [kinds, rows] = byKind(points);
  const capacity = s.device.memory_bytes;
  // past CLIP x the capacity the chart would flatten the region that matters; higher points sit on the top edge
  const top = Math.min(Math.max(capacity, ...points.map((p) => p.device_used_bytes)), CLIP * capacity) * 1.08;
  const lo = Math.log2(s.points[0].value);
  const hi = Math.log2(s.points[s.points.length - 1].value);
  const X = (v) => L + (hi > lo ? (Math.log2(v) - lo) / (hi - lo) * pw : pw / 2);
  const Y = (b) => T + ph - Math.min(b, top) / top * ph;
  const defs = svg("defs", {});
  const clip = svg("clipPath", { id: "sweep-clip" });
  clip.appendChild(svg("rect", { x: L, y: T, width: pw, height: ph }));
  defs.appendChild(clip);
  chart.appendChild(defs);
  // the GiB grid
  const step = niceStep(top / GiB / 5);
  for (let g = 0; g * step * GiB <= top; g++) {
    const y = Y(g * step * GiB);
    chart.appendChild(svg("line", { x1: L, x2: width - R, y1: y, y2: y, stroke: "#d0d7de", "stroke-width": 1 }));
    chart.appendChild(svg("text", { x: L - 6, y: y + 4, "font-size": 12, fill: "#57606a", "text-anchor": "end" },
                          `${(g * step).toLocaleString("en-US")} GiB`));
  }
  // stacked areas, one per term kind
  let lower = points.map(() => 0);
  kinds.forEach((kind, k) => {
    const upper = points.map((p, j) => lower[j] + (rows[j][kind] || 0));
    const upperPts = points.map((p, j) => `${X(p.value).toFixed(1)},${Y(upper[j]).toFixed(1)}`);
    const bottom = points.map((p, j) => `${X(p.value).toFixed(1)},${Y(lower[j]).toFixed(1)}`).reverse();
    const area = svg("polygon", { points: [...upperPts, ...bottom].join(" "), fill: COLORS[k % COLORS.length],
                                  "fill-opacity": 0.8, "data-kind": kind, "clip-path": "url(#sweep-clip)" });
    area.appendChild(svg("title", {}, kind));
    chart.appendChild(area);
    lower = upper;
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch"; sw.style.background = COLORS[k % COLORS.length];
    li.append(sw, kind);
    legend.appendChild(li);
  });
  // the device's capacity and the usable line
  for (const [bytes, name, color, dash] of [[capacity, "capacity", "#1b1f24", ""], [s.usable_bytes, "usable", "#b3261e", "6 4"]]) {
    if (!bytes || (name === "usable" && bytes === capacity)) continue;
    const y = Y(bytes);
    chart.appendChild(svg("line", { x1: L, x2: width - R, y1: y, y2: y, stroke: color, "stroke-width": 2,
                                    "stroke-dasharray": dash, "data-line": name }));
    chart.appendChild(svg("text", { x: L + 6, y: name === "usable" ? y + 14 : y - 5, "font-size": 12,
                                    fill: color, "text-anchor": "start" }, `${name} ${gib(bytes)}`));
  }
  // the largest value that fits, and where the slider is
  const q = s.largest;
  if (q && q.value !== null && q.value >= s.points[0].value && q.value <= s.points[s.points.length - 1].value) {
    const x = X(q.value);
    chart.appendChild(svg("line", { x1: x, x2: x, y1: T, y2: T + ph, stroke: "#1a7f37", "stroke-width": 2,
                                    "stroke-dasharray": "4 3", "data-line": "largest" }));
    const anchor = x > L + pw * 0.75 ? "end" : "start";
    chart.appendChild(svg("text", { x: x + (anchor === "end" ? -4 : 4), y: T + 12, "font-size": 12, fill: "#1a7f37",
                                    "text-anchor": anchor }, `largest fit ${shown(id, q.value)}`));
  }
  const now = sliderValue(id);
  if (now >= s.points[0].value && now <= s.points[s.points.length - 1].value) {
    const x = X(now);
    chart.appendChild(svg("line", { x1: x, x2: x, y1: T, y2: T + ph, stroke: "#0b5cad", "stroke-width": 1.5,
                                    "data-line": "now" }));
  }
  // the total, a point per estimate (focusable: Enter moves the slider there), the values along the axis
  chart.appendChild(svg("polyline", { points: points.map((p) => `${X(p.value).toFixed(1)},${Y(p.device_used_bytes).toFixed(1)}`).join(" "),
                                      fill: "none", stroke: "#1b1f24", "stroke-width": 1.5,
                                      "clip-path": "url(#sweep-clip)" }));
  const every = Math.max(1, Math.ceil(s.points.length * 40 / pw));
  s.points.forEach((p, i) => {
    if (i % every === 0 || i === s.points.length - 1) {
      chart.appendChild(svg("text", { x: X(p.value), y: T + ph + 18, "font-size": 12, fill: "#57606a",
                                      "text-anchor": "middle" }, shown(id, p.value)));
    }
  });
  chart.appendChild(svg("text", { x: L + pw / 2, y: height - 6, "font-size": 12, fill: "#1b1f24",
                                  "text-anchor": "middle" }, label));
  for (const p of points) {
    const words = `${label} ${shown(id, p.value)}: ${gib(p.device_used_bytes)}, ${p.fits ? "fits" : "does not fit"}`;
    const above = p.device_used_bytes > top;  // drawn hollow on the top edge
    const color = p.fits ? "#1a7f37" : "#b3261e";
    const dot = svg("circle", { cx: X(p.value), cy: Y(p.device_used_bytes), r: p.value === now ? 7 : 5,
                                fill: above ? "#fff" : color, stroke: above ? color : "#fff", "stroke-width": 1.5,
                                class: "point", tabindex: 0, role: "button", "aria-label": words,
                                "data-value": p.value });
    dot.appendChild(svg("title", {}, words));
    dot.addEventListener("click", () => pickPoint(id, p.value));
    dot.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pickPoint(id, p.value); }
    });
    chart.appendChild(dot);
    if (String(p.value) === focused) dot.focus();  // a redraw keeps the keyboard's place
  }
  sweepTable(s, id, label);
}

function sweepTable(s, id, label) {
  const [kinds, rows] = byKind(s.points);
  const table = $("sweep-table");
  const head = document.createElement("tr");
  for (const name of [label, "fits", "device used", ...kinds]) {
    const th = document.createElement("th");
    th.scope = "col"; th.textContent = name;
    head.appendChild(th);
  }
  table.appendChild(head);
  s.points.forEach((p, j) => {
    const tr = document.createElement("tr");
    const cells = p.error ? [shown(id, p.value), "error", p.error]
                          : [shown(id, p.value), p.fits ? "yes" : "no", gib(p.device_used_bytes),
                             ...kinds.map((k) => gib(rows[j][k] || 0))];
    cells.forEach((text, i) => {
      const td = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) td.scope = "row";
      if (p.error && i === 2) td.colSpan = kinds.length + 1;
      td.textContent = text;
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
}

async function copyCommand() {
  const text = $("command").value;
  try { await navigator.clipboard.writeText(text); $("copy").textContent = "Copied"; }
  catch (e) { $("command").select(); document.execCommand("copy"); $("copy").textContent = "Copied"; }
  setTimeout(() => { $("copy").textContent = "Copy"; }, 1500);
}

// ---- a pasted log: POST /v1/check, memest check --json, drawn as a table per log ----

function figureValue(n, unit) {
  if (unit === "bytes") return Math.abs(n) >= GiB ? gib(n) : (n / 2 ** 20).toLocaleString("en-US", { maximumFractionDigits: 1 }) + " MiB";
  if (unit === "x") return n.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + "x";
  if (unit === "bytes/token") return n.toLocaleString("en-US") + " B/token";
  return n.toLocaleString("en-US") + " " + unit;
}

function percentText(e) { return e === null ? "-" : (e >= 0 ? "+" : "") + (100 * e).toFixed(2) + "%"; }

function gapText(c) {
  const g = c.largest_gap;
  if (!g) return "No size figure to compare.";
  const row = c.figures.find((f) => f.figure === g.figure);
  const sign = g.delta >= 0 ? "+" : "-";
  const what = g.term ? `${g.term} (${g.figure})` : `the step's peak (${g.figure})`;
  return `Largest gap: ${what}: memest ${sign}${figureValue(Math.abs(g.delta), g.unit)} against the log` +
         (row ? ` (${percentText(row.error)}).` : ".");
}

function renderCheck(checks) {
  const out = $("check-result");
  out.replaceChildren();
  for (const c of checks) {
    const table = document.createElement("table");
    table.className = "check-table";
    const cap = document.createElement("caption");
    cap.textContent = `${c.format}${c.engine_version_logged ? " " + c.engine_version_logged : ""} log · ${c.model} on ${c.device}` +
                      (c.engine_version_modelled ? `, memest's ${c.engine} ${c.engine_version_modelled} arithmetic` : "");
    table.appendChild(cap);
    const head = document.createElement("tr");
    for (const name of ["figure", "term", "logged", "memest", "error"]) {
      const th = document.createElement("th");
      th.scope = "col"; th.textContent = name;
      if (name === "term") th.className = "term";
      head.appendChild(th);
    }
    table.appendChild(head);
    for (const f of c.figures) {
      const tr = document.createElement("tr");
      tr.dataset.figure = f.figure;
      if (c.largest_gap && c.largest_gap.figure === f.figure) tr.className = "gap";
      const cells = [f.figure, f.term || "-", figureValue(f.logged, f.unit), figureValue(f.memest, f.unit), percentText(f.error)];
      cells.forEach((text, i) => {
        const td = document.createElement(i === 0 ? "th" : "td");
        if (i === 0) td.scope = "row";
        if (i === 1) td.className = "term";
        td.textContent = text;
        if (i === 2) td.title = f.line;
        tr.appendChild(td);
      });
      table.appendChild(tr);
    }
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    wrap.appendChild(table);
    const gap = document.createElement("p");
    gap.className = "check-gap";
    gap.textContent = gapText(c);
    const notes = document.createElement("p");
    notes.className = "check-notes";
    const lines = [];
    if (c.not_logged.length) lines.push(`Not in the log (not compared): ${c.not_logged.join(", ")}.`);
    if (c.not_compared.length) lines.push(`Logged but not estimated by memest: ${c.not_compared.join(", ")}.`);
    for (const n of c.notes) lines.push(`Note: ${n}.`);
    notes.textContent = lines.join(" ");
    out.append(wrap, gap, notes);
  }
}

function showCheckError(message) {
  $("check-error").hidden = !message;
  $("check-error").textContent = message ? "Error: " + message : "";
  if (message) $("check-result").replaceChildren();
}

async function checkLog() {
  const body = { log: $("check-log").value };
  if ($("check-model").value.trim()) body.model = $("check-model").value.trim();
  if ($("check-gpu").value) body.gpu = $("check-gpu").value;
  $("check-panel").setAttribute("aria-busy", "true");
  $("check-run").disabled = true;
  try {
    const checks = await post("/v1/check", body);
    showCheckError("");
    renderCheck(checks);
  } catch (e) {
    showCheckError(e.message);
  } finally {
    $("check-panel").setAttribute("aria-busy", "false");
    $("check-run").disabled = false;
  }
}

async function start() {
  readAddress();
  const [modelList, gpuList, stackList] = await Promise.all(
    ["/v1/models", "/v1/gpus", "/v1/stacks"].map((path) => fetch(path).then((r) => r.json())));
  for (const m of modelList) {
    models[m.name] = m;
    const o = document.createElement("option");
    o.value = m.name;
    $("models").appendChild(o);
  }
  const gpu = $("gpu");
  const none = document.createElement("option");
  none.value = ""; none.textContent = "default device";
  gpu.appendChild(none);
  for (const d of gpuList) {
    const o = document.createElement("option");
    o.value = d.name; o.textContent = `${d.name} (${gib(d.memory_bytes)})`;
    gpu.appendChild(o);
  }
  if (gpu.dataset.wanted) gpu.value = gpu.dataset.wanted;
  for (const d of gpuList) {
    const o = document.createElement("option");
    o.value = d.name; o.textContent = `${d.name} (${gib(d.memory_bytes)})`;
    $("check-gpu").appendChild(o);
  }
  const stack = $("stack");
  for (const s of stackList) {
    stacks[s.name] = s;
    const o = document.createElement("option");
    o.value = s.name; o.textContent = `${s.name}: ${s.label}`;
    stack.appendChild(o);
  }
  if (stack.dataset.wanted) stack.value = stack.dataset.wanted;
  stack.addEventListener("change", showStack);
  showStack();
  fitContextSlider();
  for (const id of ["mode", "stack", "gpu", "gpus", "sweep", ...SLIDERS]) for (const ev of ["input", "change"]) $(id).addEventListener(ev, schedule);
  $("model").addEventListener("change", () => { fitContextSlider(); schedule(); });
  $("model").addEventListener("input", () => { if (models[$("model").value.trim()]) { fitContextSlider(); schedule(); } });
  $("config").addEventListener("input", schedule);
  $("copy").addEventListener("click", copyCommand);
  $("check-form").addEventListener("submit", checkLog);
  showSliders();
  update();
}

start();
