// llmplan ui: form handling and drawing only. Every figure comes from the server's answer,
// which is what `llmplan VIEW ... --json` prints for the same inputs (planner/ui/api.py).
"use strict";

const llmplan = (window.llmplan = { meta: null, last: {}, commands: {}, upload: {}, runs: 0 });
const MiB = 1048576;
const GiB = 1073741824;

function $(sel, root) { return (root || document).querySelector(sel); }
function $$(sel, root) { return Array.from((root || document).querySelectorAll(sel)); }
function form(view) { return $("#form-" + view); }

function fillSelect(sel, names, value, blank) {
  sel.textContent = "";
  if (blank) sel.append(new Option(blank, ""));
  for (const n of names) sel.append(new Option(n, n));
  sel.value = value == null ? "" : String(value);
}

function setup(meta) {
  llmplan.meta = meta;
  for (const f of $$("form.form")) {
    const view = f.id.slice("form-".length);
    const d = meta.defaults[view] || {};
    const choices = { model: meta.models, gpu: meta.gpus, engine: meta.engines,
                      weights: meta.weights, kv_cache: meta.kv_cache, prices: meta.prices };
    for (const el of $$("[name]", f)) {
      if (el.type === "file") continue;
      const name = el.name;
      const init = el.dataset.value !== undefined ? el.dataset.value : d[name];
      if (el.tagName === "SELECT" && choices[name]) {
        const blank = d[name] === null && !el.multiple ?
          (name === "prices" ? "default (" + meta.default_prices + ")" : "default") : null;
        fillSelect(el, choices[name], null, blank);
      }
      if (el.multiple) {
        const want = String(init || "").split(",");
        for (const o of el.options) o.selected = want.includes(o.value);
      } else if (init != null) {
        el.value = String(init);
      }
    }
    f.addEventListener("change", (ev) => {
      if (ev.target.name === "model_file") return readUpload(view, ev.target);
      if (f.dataset.auto !== undefined) run(view);
    });
    f.addEventListener("submit", (ev) => { ev.preventDefault(); run(view); });
    const clear = $(".clear-upload", f);
    if (clear) clear.addEventListener("click", () => {
      delete llmplan.upload[view];
      $("[name=model_file]", f).value = "";
      $("[name=model]", f).disabled = false;
      clear.hidden = true;
      run(view);
    });
  }
  for (const b of $$("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
  for (const b of $$("button.copy")) b.addEventListener("click", () => copy(b.dataset.view));
  for (const b of $$("button.download")) b.addEventListener("click", () => download(b.dataset.view));
  run("estimate");
}

function show(view) {
  for (const b of $$("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of $$(".view")) s.classList.toggle("active", s.id === "view-" + view);
  for (const c of $$("#view-" + view + " .js-plotly-plot")) Plotly.Plots.resize(c);
}

function readUpload(view, input) {
  const file = input.files[0];
  const f = form(view);
  if (!file) return;
  const limit = llmplan.meta.max_upload_bytes;
  if (file.size > limit) {  // the CLI's own words for a file that large (planner/io/boundary.py)
    showError(view, { field: "model", error: "llmplan: error: " + file.name + ": " +
      (file.size / MiB).toFixed(1) + " MiB, larger than the " + Math.floor(limit / MiB) +
      " MiB a file may be" });
    input.value = "";
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    llmplan.upload[view] = { name: file.name, text: String(reader.result) };
    $("[name=model]", f).disabled = true;
    $(".clear-upload", f).hidden = false;
    run(view);
  };
  reader.readAsText(file);
}

function fields(view) {
  const out = {};
  for (const el of $$("[name]", form(view))) {
    if (el.type === "file" || el.disabled) continue;
    if (el.multiple) out[el.name] = Array.from(el.selectedOptions).map((o) => o.value).join(",");
    else out[el.name] = el.value;
  }
  return out;
}

function showError(view, answer) {
  const f = form(view);
  for (const e of $$(".err", f)) e.textContent = "";
  for (const el of $$(".bad", f)) el.classList.remove("bad");
  if (!answer) return;
  let span = $('.err[data-for="' + (answer.field || "") + '"]', f) || $('.err[data-for=""]', f);
  span.textContent = answer.error;
  const input = answer.field && $('[name="' + answer.field + '"]', f);
  if (input) input.classList.add("bad");
}

async function run(view) {
  const f = form(view);
  const body = { fields: fields(view) };
  if (llmplan.upload[view]) body.config = llmplan.upload[view];
  const seq = (f.dataset.seq = String(Number(f.dataset.seq || 0) + 1));
  $("#view-" + view + " .results").classList.add("busy");
  let answer;
  try {
    const r = await fetch("/api/" + view, { method: "POST", body: JSON.stringify(body),
                                              headers: { "Content-Type": "application/json" } });
    answer = await r.json();
  } catch (err) {
    answer = { error: "llmplan ui: the server did not answer (" + err + ")", field: null };
  }
  if (seq !== f.dataset.seq) return;  // a newer request is on its way
  $("#view-" + view + " .results").classList.remove("busy");
  if (answer.error) {
    showError(view, answer);
  } else {
    showError(view, null);
    llmplan.last[view] = answer.json;
    llmplan.commands[view] = answer.command;
    $("#cmd-" + view).textContent = answer.command;
    DRAW[view](answer.json, answer.extra || {});
  }
  llmplan.runs += 1;
  document.body.dataset.runs = String(llmplan.runs);
}

function copy(view) {
  const text = llmplan.commands[view] || "";
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  const sel = window.getSelection();
  const range = document.createRange();
  range.selectNodeContents($("#cmd-" + view));
  sel.removeAllRanges();
  sel.addRange(range);
}

function download(view) {
  if (!llmplan.last[view]) return;
  const blob = new Blob([JSON.stringify(llmplan.last[view], null, 2) + "\n"],
                        { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "llmplan-" + view + ".json";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ------------------------------------------------------------------------- formatting
function num(v, digits) {
  if (v == null || !isFinite(v)) return "-";
  return Number(v).toLocaleString("en-US", { maximumSignificantDigits: digits || 3 });
}
function ms(s) { return s == null ? "-" : num(s * 1e3) + " ms"; }
function tps(v) { return v == null ? "-" : num(v) + " tok/s"; }
function gib(b) { return b == null ? "-" : num(b / GiB) + " GiB"; }

function card(name, value, low, high, fmt) {
  const band = low != null && high != null ? "band " + fmt(low) + " - " + fmt(high) : "no error band";
  return '<div class="card" data-key="' + name.key + '"><div class="name">' + name.label +
    '</div><div class="value">' + fmt(value) + '</div><div class="band">' + band + "</div></div>";
}

const LAYOUT = { margin: { l: 60, r: 20, t: 40, b: 50 }, font: { size: 11 },
                 title: { x: 0.02, xanchor: "left" } };
// the mode bar keeps the buttons a reader uses (save, zoom, pan, reset): the full bar is as
// wide as half a chart and covered the charts' titles
const CONFIG = { displaylogo: false, responsive: true, displayModeBar: "hover",
                 modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d",
                                          "autoScale2d", "toggleSpikelines",
                                          "hoverClosestCartesian", "hoverCompareCartesian",
                                          "sendDataToCloud"] };

// ------------------------------------------------------------------------- estimate
function drawEstimate(d, extra) {
  const group = extra.layout_section ? " (one TP group of the layout)" : "";
  const keys = [["ttft_s", "TTFT", ms], ["tpot_s", "TPOT", ms], ["latency_s", "latency", ms],
                ["throughput_tokens_per_s", "throughput", tps]];
  $("#headline-estimate").innerHTML = keys.map(([k, label, fmt]) =>
    card({ key: k, label: label }, d[k], d[k + "_low"], d[k + "_high"], fmt)).join("") +
    '<div class="card" data-key="fits"><div class="name">memory per GPU</div><div class="value">' +
    (d.fits ? "fits" : "does not fit") + '</div><div class="band">' +
    gib(extra.memory_per_gpu_bytes) + " of " + gib(d.usable_memory_bytes) + " usable</div></div>" +
    '<div class="card" data-key="bound"><div class="name">decode</div><div class="value">' +
    esc(d.bound) + '-bound</div><div class="band">MBU ' + num(d.mbu * 100) + "%, MFU " +
    num(d.mfu * 100) + "%</div></div>";
  const parts = [["weights", d.weights_bytes], ["KV cache", d.kv_cache_bytes],
                 ["activations", d.activation_bytes], ["reserve", d.reserve_bytes]];
  Plotly.react("chart-memory", parts.map(([name, b]) => ({
    type: "bar", orientation: "h", name: name, y: ["needed"], x: [b / GiB],
    hovertemplate: name + ": %{x:.2f} GiB<extra></extra>" })), {
    ...LAYOUT, barmode: "stack", title: { ...LAYOUT.title, text: group ? "Memory of one TP group on its own (GiB)" : "Memory per GPU (GiB)" },
    xaxis: { title: { text: "GiB" } }, legend: { orientation: "h", y: -0.3 },
    shapes: [{ type: "line", x0: d.usable_memory_bytes / GiB, x1: d.usable_memory_bytes / GiB,
               y0: -0.5, y1: 0.5, line: { color: "#c62828", dash: "dash" } }],
    annotations: [{ x: d.usable_memory_bytes / GiB, y: 0.5, text: "usable", showarrow: false,
                    yanchor: "bottom", font: { color: "#c62828" } }] }, CONFIG);
  drawRoofline(d, group);
  const kv = d.kv_concurrency || {};
  const rows = [["KV cache per token", num(d.kv_cache_bytes_per_token / 1024) + " KiB"],
                ["KV capacity", num(kv.kv_capacity_tokens, 6) + " tokens"],
                ["concurrent sequences, paged", num(kv.max_concurrency_paged, 6)],
                ["concurrent sequences, contiguous", num(kv.max_concurrency_contiguous, 6)],
                ["max model length", num(kv.max_model_len, 7)],
                ["max batch (memory)", num(d.max_batch, 6)],
                ["optimal batch (roofline)", num(d.optimal_batch)]];
  $("#kv-estimate").innerHTML = "<tr><th colspan=2>KV concurrency</th></tr>" + rows.map(
    ([k, v]) => "<tr><td>" + k + '</td><td class="num">' + v + "</td></tr>").join("");
}

function drawRoofline(d, group) {
  const ops = d.operators || {};
  const traces = [];
  let lo = Infinity, hi = 0;
  for (const [phase, color] of [["decode", "#1565c0"], ["prefill", "#ef6c00"]]) {
    const pts = (ops[phase] || []).filter((o) => o.flops > 0 && o.time_s > 0);
    for (const o of pts) { lo = Math.min(lo, o.intensity_flops_per_byte); hi = Math.max(hi, o.intensity_flops_per_byte); }
    traces.push({ type: "scatter", mode: "markers", name: phase + " operators",
                  x: pts.map((o) => o.intensity_flops_per_byte),
                  y: pts.map((o) => o.flops / o.time_s),
                  text: pts.map((o) => o.name + " (" + o.bound + "-bound)"),
                  marker: { color: color, size: 9 },
                  hovertemplate: "%{text}<br>%{x:.3g} FLOP/B, %{y:.3g} FLOP/s<extra></extra>" });
  }
  if (!isFinite(lo)) { lo = 1; hi = 1000; }
  const x0 = Math.min(lo, d.ridge_flops_per_byte) / 4, x1 = Math.max(hi, d.ridge_flops_per_byte) * 4;
  const xs = [x0, d.ridge_flops_per_byte, x1];
  traces.push({ type: "scatter", mode: "lines", name: "roofline", x: xs,
                y: xs.map((x) => Math.min(d.peak_flops_per_s, x * d.bandwidth_bytes_per_s)),
                line: { color: "#455a64" }, hoverinfo: "skip" });
  Plotly.react("chart-roofline", traces, {
    ...LAYOUT, title: { ...LAYOUT.title, text: "Roofline: the step's operators" + group },
    xaxis: { type: "log", title: { text: "arithmetic intensity (FLOP/byte)" } },
    yaxis: { type: "log", exponentformat: "SI", title: { text: "FLOP/s" } }, legend: { orientation: "h", y: -0.25 } },
    CONFIG);
}

// ------------------------------------------------------------------------- plan
function drawPlan(rows, extra) {
  const tk = extra.ttft_key, pk = extra.tpot_key;
  const meets = rows.filter((r) => r.meets_targets);
  $("#summary-plan").textContent = rows.length ?
    rows.length + " configurations sized, " + meets.length + " meet the targets; ranked by " +
    "cost on price set " + extra.price_set + "." :
    "No configuration meets the targets (llmplan plan without --json says the nearest miss).";
  const head = ["#", "gpu", "layout", "w", "kv", "req/s each", tk.split("_")[0] + " TTFT ms",
                tk.split("_")[0] + " TPOT ms", "replicas", "GPUs", "$/h", "$/1M out"];
  const body = rows.slice(0, 25).map((r, i) => [
    r.rank, r.gpu, extra.layout[i], r.weights, r.kv_cache, num(r.rate_per_replica),
    num(r[tk] * 1e3), num(r[pk] * 1e3),
    r.disaggregated ? r.prefill_instances + "+" + r.decode_instances : r.replicas,
    r.total_gpus, num(r.usd_per_hour, 4), num(r.cost_usd_per_million_output_tokens_at_traffic, 4)]);
  $("#table-plan").innerHTML = "<tr>" + head.map((h) => "<th>" + h + "</th>").join("") +
    "</tr>" + body.map((cells) => "<tr>" + cells.map((c, j) =>
      "<td" + (j >= 5 ? ' class="num"' : "") + ">" + esc(c) + "</td>").join("") + "</tr>").join("");
  const label = (r) => "#" + r.rank + " " + r.gpu + " " + extra.layout[rows.indexOf(r)] + " " + r.weights;
  const byRank = new Map(rows.map((r) => [r.rank, r]));
  const front = extra.pareto_ranks.map((k) => byRank.get(k));
  const cost = "cost_usd_per_million_output_tokens_at_traffic";
  Plotly.react("chart-pareto", [
    { type: "scatter", mode: "markers", name: "meets the targets (" + meets.length + ")",
      x: meets.map((r) => r.latency_s), y: meets.map((r) => r[cost]), text: meets.map(label),
      marker: { color: "#90a4ae", size: 8 },
      hovertemplate: "%{text}<br>%{x:.3g} s, $%{y:.3g} per 1M<extra></extra>" },
    { type: "scatter", mode: "lines+markers", name: "Pareto front (cost vs latency)",
      x: front.map((r) => r.latency_s), y: front.map((r) => r[cost]), text: front.map(label),
      marker: { color: "#c62828", size: 9 }, line: { color: "#c62828" },
      hovertemplate: "%{text}<br>%{x:.3g} s, $%{y:.3g} per 1M<extra></extra>" }], {
    ...LAYOUT, title: { ...LAYOUT.title, text: "Cost against latency (prices: " + extra.price_set + ")" },
    xaxis: { title: { text: tk.split("_")[0] + " end-to-end latency per request (s, simulated)" } },
    yaxis: { title: { text: "USD per 1M output tokens" } },
    legend: { orientation: "h", y: -0.25 } }, CONFIG);
}

function esc(v) {
  return String(v == null ? "-" : v).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

// ------------------------------------------------------------------------- simulate
function drawSimulate(runs) {
  const rate = (d) => d.request_rate === "inf" ? "inf" : num(d.request_rate);
  const tput = runs.map((d) => d.output_throughput);
  const hover = "%{text} req/s offered<br>%{x:.4g} tok/s, %{y:.4g} ms<extra></extra>";
  const line = (name, key, color, dash) => ({
    type: "scatter", mode: "lines+markers", name: name, x: tput, y: runs.map((d) => d[key]),
    text: runs.map(rate), line: { color: color, dash: dash || "solid" }, hovertemplate: hover });
  Plotly.react("chart-curve", [
    line("median end-to-end", "median_e2el_ms", "#1565c0"),
    line("p99 end-to-end", "p99_e2el_ms", "#1565c0", "dot")], {
    ...LAYOUT, title: { ...LAYOUT.title, text: "Latency against throughput" },
    xaxis: { title: { text: "output throughput (tokens/s)" } },
    yaxis: { title: { text: "latency per request (ms)" } }, legend: { orientation: "h", y: -0.25 } },
    CONFIG);
  const offered = runs.map((d) => d.request_throughput);
  const byRate = (name, key, color, dash) => ({
    type: "scatter", mode: "lines+markers", name: name, x: offered, y: runs.map((d) => d[key]),
    text: runs.map(rate), line: { color: color, dash: dash || "solid" },
    hovertemplate: "%{text} req/s offered<br>%{x:.4g} req/s served, %{y:.4g} ms<extra></extra>" });
  Plotly.react("chart-rates", [
    byRate("median TTFT", "median_ttft_ms", "#ef6c00"), byRate("p99 TTFT", "p99_ttft_ms", "#ef6c00", "dot"),
    byRate("median TPOT", "median_tpot_ms", "#2e7d32"), byRate("p99 TPOT", "p99_tpot_ms", "#2e7d32", "dot")], {
    ...LAYOUT, title: { ...LAYOUT.title, text: "TTFT and TPOT against the load" },
    xaxis: { title: { text: "requests served per second" } },
    yaxis: { title: { text: "ms" }, rangemode: "tozero" }, legend: { orientation: "h", y: -0.25 } },
    CONFIG);
  const head = ["req/s offered", "req/s served", "output tok/s", "median TTFT ms", "p99 TTFT ms",
                "median TPOT ms", "p99 TPOT ms", "median e2e ms", "max running", "preempted", "regime"];
  const rows = runs.map((d) => [rate(d), num(d.request_throughput), num(d.output_throughput, 4),
    num(d.median_ttft_ms), num(d.p99_ttft_ms), num(d.median_tpot_ms), num(d.p99_tpot_ms),
    num(d.median_e2el_ms, 4), d.max_running_requests, d.preemptions, d.regime]);
  $("#table-simulate").innerHTML = "<tr>" + head.map((h) => "<th>" + h + "</th>").join("") +
    "</tr>" + rows.map((cells) => "<tr>" + cells.map((c, j) =>
      "<td" + (j < 10 ? ' class="num"' : "") + ">" + esc(c) + "</td>").join("") + "</tr>").join("");
}

const DRAW = { estimate: drawEstimate, plan: drawPlan, simulate: drawSimulate };

fetch("/api/meta").then((r) => r.json()).then(setup).catch((err) => {
  document.body.insertAdjacentText("afterbegin", "llmplan ui: cannot load /api/meta: " + err);
});
