// helios live dashboard: polls each run's new events (by byte offset) and redraws the charts with Plotly.
// All data comes from this page's own server (see telemetry/serve.py); nothing is fetched from elsewhere.
"use strict";

const POLL_MS = 1000;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
// Each run's val-loss colour: a contrasting one per PALETTE entry, so val is never hidden under its train line.
const VAL_PALETTE = ["#ff7f0e", "#1f77b4", "#d62728", "#2ca02c", "#bcbd22", "#17becf", "#2ca02c", "#8c564b"];
const DASHES = ["solid", "dash", "dot", "dashdot"];
const TIME_PARTS = [["fwd_ms", "fwd", "#4c78a8"], ["bwd_ms", "bwd", "#f58518"], ["opt_ms", "opt", "#54a24b"],
                    ["wait_ms", "wait", "#b279a2"], ["comm_ms", "comm", "#e45756"]];
const PEAK_KEY = "pool_peak_in_use";  // the most bytes live tensors held during the step
const KEEP_SAMPLES = 3;
const MIB = 1048576;

const runs = [];
let dirty = true;
let rendered = false;

function reportError(text) {
  const box = document.getElementById("errors");
  box.hidden = false;
  box.textContent += text + "\n";
}
window.addEventListener("error", (e) => reportError("page error: " + e.message));
window.addEventListener("unhandledrejection", (e) => reportError("page error: " + e.reason));

function newRun(info) {
  return {id: info.id, name: info.name, path: info.path, exists: info.exists, offset: 0, error: null,
          steps: [], evals: [], skips: [], samples: [], resumes: [], header: null, status: "waiting",
          config: null, configWanted: false, color: PALETTE[info.id % PALETTE.length],
          valColor: VAL_PALETTE[info.id % VAL_PALETTE.length]};
}

function clearRun(run) {
  Object.assign(run, {offset: 0, steps: [], evals: [], skips: [], samples: [], resumes: [], header: null,
                      status: "waiting", config: null});
}

// A resumed run logs steps after its checkpoint again: keep only the trajectory that survived.
function dropAfter(run, step) {
  const keep = (e) => typeof e.step !== "number" || e.step <= step;
  run.steps = run.steps.filter(keep);
  run.evals = run.evals.filter(keep);
  run.skips = run.skips.filter(keep);
  run.samples = run.samples.filter(keep);
  run.resumes = run.resumes.filter((s) => s < step);
}

function fold(run, e) {
  switch (e.event) {
    case "config":
      if (typeof e.start_step === "number") {
        dropAfter(run, e.start_step);
        if (e.start_step > 0) run.resumes.push(e.start_step);
      }
      run.header = e;
      run.status = "running";
      run.configWanted = true;
      break;
    case "step": run.steps.push(e); run.status = "running"; break;
    case "eval": run.evals.push(e); break;
    case "skip": run.skips.push(e); break;
    case "sample": run.samples.push(e); run.samples = run.samples.slice(-KEEP_SAMPLES); break;
    case "end": run.status = e.status || "ended"; break;
    default: break;
  }
}

async function getJSON(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(url + ": HTTP " + response.status);
  return response.json();
}

async function pollRun(run) {
  for (;;) {  // catch up in chunks, then wait for the next tick
    const r = await getJSON(`/api/runs/${run.id}/events?offset=${run.offset}`);
    if (r.reset) { clearRun(run); dirty = true; }
    if (r.exists !== run.exists || (r.error || null) !== run.error) dirty = true;
    run.exists = r.exists;
    run.error = r.error || null;
    if (r.events.length) dirty = true;
    for (const e of r.events) fold(run, e);
    const advanced = r.offset > run.offset;
    run.offset = r.offset;
    if (!advanced || r.offset >= r.size) break;
  }
  if (run.configWanted) {
    run.configWanted = false;
    run.config = await getJSON(`/api/runs/${run.id}/config`);
    dirty = true;
  }
}

const num = (v) => typeof v === "number" && Number.isFinite(v);

function series(rows, key, scale = 1) {
  const x = [], y = [];
  for (const e of rows) if (num(e[key])) { x.push(e.step); y.push(e[key] * scale); }
  return {x, y};
}

function line(run, rows, key, name, extra = {}) {
  return Object.assign({type: "scatter", mode: "lines", name, line: {color: run.color, width: 1.5}},
                       series(rows, key, extra.scale || 1), extra.trace || {});
}

function resumeShapes() {
  const shapes = [];
  for (const run of runs) {
    for (const s of run.resumes) {
      shapes.push({type: "line", x0: s, x1: s, yref: "paper", y0: 0, y1: 1,
                   line: {color: run.color, width: 1, dash: "dot"}});
    }
  }
  return shapes;
}

function layout(title, extra = {}) {
  return Object.assign({
    title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"}, margin: {l: 56, r: 12, t: 34, b: 36},
    xaxis: {title: {text: "step", standoff: 4}, zeroline: false}, yaxis: {zeroline: false},
    legend: {font: {size: 10}}, shapes: resumeShapes(), uirevision: "keep", paper_bgcolor: "#fff",
  }, extra);
}

// An empty chart says why instead of drawing bare axes.
function note(text) {
  return {annotations: [{text, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
                         font: {color: "#888"}}], xaxis: {visible: false}, yaxis: {visible: false}, shapes: []};
}

function chartLoss() {
  const traces = [];
  for (const r of runs) {
    traces.push(line(r, r.steps, "loss", `${r.name} train loss`));
    traces.push(line(r, r.evals, "val_loss", `${r.name} val loss`,
                     {trace: {mode: "lines+markers", line: {color: r.valColor, dash: "dash", width: 2},
                              marker: {size: 6, color: r.valColor}}}));
  }
  return [traces, layout("loss (train, val)", {showlegend: true})];
}

function chartLr() {
  return [runs.map((r) => line(r, r.steps, "lr", r.name)), layout("learning rate",
          {yaxis: {exponentformat: "e", zeroline: false}})];
}

function chartGrad() {
  const traces = [];
  let positive = true;
  for (const r of runs) {
    const g = line(r, r.steps, "grad_norm", `${r.name} grad norm`);
    positive = positive && g.y.every((v) => v > 0);
    traces.push(g);
    const clipped = r.steps.filter((e) => num(e.clip_coef) && e.clip_coef < 1 && num(e.grad_norm));
    traces.push(Object.assign({type: "scatter", mode: "markers", name: `${r.name} clipped`,
                               marker: {color: r.color, symbol: "circle-open", size: 7}},
                              series(clipped, "grad_norm")));
    // A skipped step often has no finite norm: mark it at the last finite one before it.
    const x = [], y = [];
    for (const s of r.skips) {
      let at = null;
      for (const e of r.steps) if (e.step <= s.step && num(e.grad_norm)) at = e.grad_norm;
      x.push(s.step);
      y.push(num(s.grad_norm) ? s.grad_norm : at);
    }
    traces.push({type: "scatter", mode: "markers", name: `${r.name} skipped`, x, y,
                 marker: {color: "#d62728", symbol: "x", size: 10, line: {width: 1}}});
  }
  const yaxis = positive ? {type: "log", tickformat: "~g", zeroline: false} : {zeroline: false};
  return [traces, layout("gradient norm (clipped ○, skipped ×)", {yaxis})];
}

function chartThroughput() {
  return [runs.map((r) => line(r, r.steps, "tok_per_s", r.name)), layout("throughput (tokens/s)")];
}

function chartMfu() {
  const traces = runs.map((r) => line(r, r.steps, "mfu", r.name, {scale: 100}));
  const extra = traces.some((t) => t.y.length) ? {} : note("no MFU logged (the device's peak FLOP/s is unknown)");
  return [traces, layout("MFU (%)", extra)];
}

function chartStepTime() {
  const traces = [];
  const stacked = runs.length === 1;
  runs.forEach((r, i) => {
    for (const [key, label, color] of TIME_PARTS) {
      traces.push(Object.assign({type: "scatter", mode: "lines", name: runs.length > 1 ? `${r.name} ${label}` : label,
                                 line: {color, width: 1.2, dash: DASHES[i % DASHES.length]}},
                                series(r.steps, key), stacked ? {stackgroup: "time"} : {}));
    }
  });
  // The first step after a start or resume includes kernel compilation and can be 100x the rest: size the axis
  // to the steady steps (the 95th percentile), so the split stays readable; zooming out shows the outlier.
  const totals = [];
  for (const r of runs) {
    for (const e of r.steps) {
      const parts = TIME_PARTS.map(([key]) => e[key]).filter(num);
      if (parts.length) totals.push(stacked ? parts.reduce((a, b) => a + b, 0) : Math.max(...parts));
    }
  }
  totals.sort((a, b) => a - b);
  const top = totals.length ? totals[Math.floor(0.95 * (totals.length - 1))] * 1.3 : 0;
  const yaxis = top > 0 ? {range: [0, top], zeroline: false} : {zeroline: false};
  return [traces, layout(stacked ? "step time split (ms, stacked)" : "step time split (ms)", {yaxis})];
}

function chartMemory() {
  const traces = [];
  for (const r of runs) {
    traces.push(line(r, r.steps, "pool_bytes", `${r.name} reserved`, {scale: 1 / MIB}));
    if (r.steps.some((e) => num(e[PEAK_KEY]) && e[PEAK_KEY] > 0)) {  // the torch backend logs zeros
      traces.push(line(r, r.steps, PEAK_KEY, `${r.name} peak in use`,
                       {scale: 1 / MIB, trace: {line: {color: r.color, dash: "dash", width: 1.5}}}));
    }
  }
  const extra = traces.some((t) => t.y.length) ? {yaxis: {rangemode: "tozero", zeroline: false}}
    : note("no device memory counters logged");
  return [traces, layout("device memory pool (MiB)", extra)];
}

function chartDispatches() {
  const traces = [];
  for (const r of runs) {
    traces.push(line(r, r.steps, "dispatches", `${r.name} dispatches`));
    traces.push(line(r, r.steps, "submits", `${r.name} submits`,
                     {trace: {line: {color: r.color, dash: "dot", width: 1.5}}}));
  }
  const extra = traces.some((t) => t.y.length) ? {yaxis: {type: "log", tickformat: "~g", zeroline: false}}
    : note("no dispatch counters logged");
  return [traces, layout("dispatches and submits per step", extra)];
}

const CHARTS = [["chart-loss", chartLoss], ["chart-lr", chartLr], ["chart-grad", chartGrad],
                ["chart-tps", chartThroughput], ["chart-mfu", chartMfu], ["chart-time", chartStepTime],
                ["chart-mem", chartMemory], ["chart-disp", chartDispatches]];

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;  // textContent only: log text is never parsed as HTML
  if (cls) node.className = cls;
  return node;
}

function fmt(v, digits = 4) { return num(v) ? v.toFixed(digits) : "-"; }

function renderHeader() {
  const box = document.getElementById("runs");
  box.replaceChildren();
  for (const r of runs) {
    const div = el("div", undefined, "run");
    const swatch = el("span", undefined, "swatch");
    swatch.style.background = r.color;
    div.append(swatch, el("b", r.name));
    if (r.error) {
      div.append(" ", el("span", r.error, "error"));
    } else if (!r.exists) {
      div.append(" ", el("span", `waiting for ${r.path} to appear`, "waiting"));
    } else {
      const h = r.header || {};
      const last = r.steps[r.steps.length - 1] || {};
      const where = h.backend ? ` ${h.backend} on ${h.device}` : "";
      div.append(`${where} · step ${last.step ?? h.start_step ?? 0} / ${h.max_iters ?? "?"} · ${r.status}` +
                 ` · loss ${fmt(last.loss)}` + (r.resumes.length ? ` · resumed at ${r.resumes.join(", ")}` : ""));
    }
    box.append(div);
  }
}

function renderText() {
  const samples = document.getElementById("samples");
  samples.replaceChildren();
  const config = document.getElementById("config");
  config.replaceChildren();
  for (const r of runs) {
    for (const s of r.samples.slice().reverse()) {
      samples.append(el("div", `${r.name}, step ${s.step}`), el("pre", (s.prompt || "") + (s.text || "")));
    }
    if (r.config) {
      const details = el("details");
      details.open = runs.length === 1;
      details.append(el("summary", r.name), el("pre", JSON.stringify(r.config, null, 2)));
      config.append(details);
    }
  }
  if (!samples.childElementCount) samples.append(el("div", "no samples yet"));
  if (!config.childElementCount) config.append(el("div", "no config yet"));
}

async function render() {
  renderHeader();
  renderText();
  let drawn = 0;
  for (const [id, make] of CHARTS) {
    const [traces, lay] = make();
    await Plotly.react(id, traces, lay, {displaylogo: false, responsive: true, displayModeBar: false});
    drawn += 1;
  }
  const events = runs.reduce((n, r) => n + r.steps.length, 0);
  document.body.dataset.charts = String(drawn);
  document.body.dataset.steps = String(events);
}

async function tick() {
  try {
    await Promise.all(runs.map(pollRun));
    if (dirty || !rendered) {
      dirty = false;
      await render();
      rendered = true;
    }
    document.body.dataset.offline = "";
    for (const node of document.querySelectorAll(".offline")) node.remove();
  } catch (err) {
    document.body.dataset.offline = String(err);
    const box = document.getElementById("runs");
    if (!box.querySelector(".offline")) box.append(el("div", "server unreachable; retrying", "error offline"));
  }
  setTimeout(tick, POLL_MS);
}

async function start() {
  for (const info of await getJSON("/api/runs")) runs.push(newRun(info));
  await tick();
}

start().catch((err) => reportError("cannot start the dashboard: " + err));
