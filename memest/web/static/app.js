// memest's page: the job form, the estimate from POST /v1/estimate drawn as a stacked SVG bar against the
// device's capacity and usable line, and the same settings in the address so a link reproduces the view.
// Request fields are the Python API's keyword names; nothing here is loaded from the network.
"use strict";

const GiB = 2 ** 30;
const SLIDERS = ["micro_batch_size", "seq_len", "max_model_len", "batch_size"];
const TRAINING = ["micro_batch_size", "seq_len"];
const SERVING = ["max_model_len", "batch_size"];
const COLORS = ["#0b5cad", "#e8710a", "#1a7f37", "#a142f4", "#d93025", "#12a4af", "#8d6e63", "#f4b400",
                "#5f6368", "#c2185b"];
const $ = (id) => document.getElementById(id);
let models = {};
let seq = 0;
let timer = null;

function gib(n) { return (n / GiB).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + " GiB"; }
function tokens(n) { return n >= 1024 && n % 1024 === 0 ? (n / 1024) + "k" : String(n); }
function sliderValue(id) { return 2 ** Number($(id).value); }
function isServing() { return $("mode").value === "serve"; }

function showSliders() {
  for (const el of document.querySelectorAll(".slider")) {
    el.hidden = el.classList.contains("serve") !== isServing();
  }
  for (const id of SLIDERS) {
    $(id + "-out").textContent = id === "seq_len" || id === "max_model_len" ? tokens(sliderValue(id)) : sliderValue(id);
  }
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
  if ($("gpu").value) body.gpu = $("gpu").value;
  const count = Number($("gpus").value);
  if (count > 1) body.gpus = count;
  for (const id of isServing() ? SERVING : TRAINING) body[id] = sliderValue(id);
  return body;
}

function writeAddress(body) {
  const q = new URLSearchParams();
  if (body.model) q.set("model", body.model);
  for (const key of ["mode", "gpu", "gpus", ...SLIDERS]) if (body[key] !== undefined) q.set(key, body[key]);
  history.replaceState(null, "", "?" + q.toString());
}

function readAddress() {
  const q = new URLSearchParams(location.search);
  if (q.get("model")) $("model").value = q.get("model");
  if (q.get("mode")) $("mode").value = q.get("mode");
  if (q.get("gpu")) $("gpu").dataset.wanted = q.get("gpu");
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
  if (message) { $("verdict").textContent = "No estimate."; $("verdict").className = "verdict"; }
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
window.addEventListener("resize", () => { if (last) drawBar(...last); });

function render(e, command) {
  const pd = e.per_device;
  const v = $("verdict");
  const where = `${e.device.count} × ${e.device.name}`;
  v.textContent = e.fits ? `Fits on ${where}: ${gib(e.margin_bytes)} to spare`
                         : `Does not fit on ${where}: ${gib(-e.margin_bytes)} over` +
                           (e.fit_blocker ? ` (${e.fit_blocker})` : "");
  v.className = "verdict " + (e.fits ? "fits" : "nofit");
  $("band").textContent = `Device used ${gib(pd.device_used_bytes)} (band ${gib(pd.low_bytes)} – ${gib(pd.high_bytes)}); ` +
    `peak allocated ${gib(pd.allocated_bytes)}, reserved ${gib(pd.reserved_bytes)}; usable ${gib(e.usable_bytes)} ` +
    `of ${gib(e.device.memory_bytes)}.`;
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
  if (!e.fits && !r.cheapest && !r.lossless) rec.textContent = "No change within the search fits; try memest plan.";
  $("command").value = command;
}

async function copyCommand() {
  const text = $("command").value;
  try { await navigator.clipboard.writeText(text); $("copy").textContent = "Copied"; }
  catch (e) { $("command").select(); document.execCommand("copy"); $("copy").textContent = "Copied"; }
  setTimeout(() => { $("copy").textContent = "Copy"; }, 1500);
}

async function start() {
  readAddress();
  const [modelList, gpuList] = await Promise.all([fetch("/v1/models").then((r) => r.json()),
                                                  fetch("/v1/gpus").then((r) => r.json())]);
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
  fitContextSlider();
  for (const id of ["mode", "gpu", "gpus", ...SLIDERS]) for (const ev of ["input", "change"]) $(id).addEventListener(ev, schedule);
  $("model").addEventListener("change", () => { fitContextSlider(); schedule(); });
  $("model").addEventListener("input", () => { if (models[$("model").value.trim()]) { fitContextSlider(); schedule(); } });
  $("config").addEventListener("input", schedule);
  $("copy").addEventListener("click", copyCommand);
  showSliders();
  update();
}

start();
