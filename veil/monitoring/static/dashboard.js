// The live dashboard: reads the broker's /metrics every second (the same figures Prometheus
// scrapes), keeps the last five minutes, and draws them with uPlot. Rates and latency percentiles
// are computed over a window of WINDOW samples, as Prometheus' rate() and histogram_quantile() would.
"use strict";

const INTERVAL = 1000;  // ms between reads of /metrics
const KEEP = 300;  // samples kept (five minutes)
const WINDOW = 5;  // samples a rate or a percentile is computed over
const LATENCY = "veil_delivery_latency_seconds";
const BATCHES = "veil_batch_duration_seconds";

// Prometheus' text format: `name{labels} value` lines; comments and types are not needed here.
function parse(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/);
    if (match) samples.set(match[1] + (match[2] || ""), Number(match[3]));
  }
  return samples;
}

// A histogram's cumulative buckets as [[upper bound, count], ...], +Inf last.
function buckets(samples, name) {
  const found = [];
  const prefix = name + '_bucket{le="';
  for (const [key, value] of samples) {
    if (key.startsWith(prefix)) {
      const le = key.slice(prefix.length, key.indexOf('"', prefix.length));
      found.push([le === "+Inf" ? Infinity : Number(le), value]);
    }
  }
  return found.sort((a, b) => a[0] - b[0]);
}

// The q-quantile of the observations between two readings of a histogram, interpolated linearly
// within the bucket it falls in (histogram_quantile's rule); null when nothing was observed.
function quantile(q, now, before) {
  const counts = now.map(([le, count], i) => [le, count - (before[i] ? before[i][1] : 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [le, count] of counts) {
    if (count >= rank) {
      if (le === Infinity) return lower;
      return lower + (le - lower) * ((rank - below) / Math.max(count - below, 1e-9));
    }
    lower = le === Infinity ? lower : le;
    below = count;
  }
  return lower;
}

const history = [];  // {at: seconds, samples: Map}
const series = { time: [], received: [], matched: [], delivered: [], p50: [], p95: [], p99: [], lag: [],
  queued: [], sessionQueue: [], connections: [], subscriptions: [], batch: [] };

function windowed(name) {
  const last = history[history.length - 1], first = history[Math.max(0, history.length - 1 - WINDOW)];
  if (last === first) return null;
  const grown = (last.samples.get(name) ?? 0) - (first.samples.get(name) ?? 0);
  return Math.max(0, grown) / (last.at - first.at);
}

function windowQuantile(q) {
  const last = history[history.length - 1], first = history[Math.max(0, history.length - 1 - WINDOW)];
  const value = quantile(q, buckets(last.samples, LATENCY), buckets(first.samples, LATENCY));
  return value === null ? null : value * 1000;
}

function meanBatch() {
  const last = history[history.length - 1], first = history[Math.max(0, history.length - 1 - WINDOW)];
  const count = (last.samples.get(BATCHES + "_count") ?? 0) - (first.samples.get(BATCHES + "_count") ?? 0);
  const sum = (last.samples.get(BATCHES + "_sum") ?? 0) - (first.samples.get(BATCHES + "_sum") ?? 0);
  return count > 0 ? (sum / count) * 1000 : null;
}

function show(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(digits);
}

function chart(id, labels, colors) {
  const element = document.getElementById(id);
  const options = {
    width: Math.max(480, element.clientWidth), height: 220,
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 2, spanGaps: false }))],
    axes: [{}, { size: 60 }],
    scales: { x: { time: true } },
  };
  return new uPlot(options, [[], ...labels.map(() => [])], element);
}

const charts = {
  rates: chart("rates", ["received", "matched", "delivered"], ["#3366cc", "#ff9900", "#109618"]),
  latency: chart("latency", ["p50", "p95", "p99"], ["#109618", "#ff9900", "#dc3912"]),
  queues: chart("queues", ["pipeline lag", "queued (store)", "queued (memory)"], ["#990099", "#3366cc", "#0099c6"]),
  clients: chart("clients", ["connections", "subscriptions"], ["#3366cc", "#dd4477"]),
  batches: chart("batches", ["mean duration"], ["#66aa00"]),
};

function record(samples) {
  history.push({ at: performance.now() / 1000, samples });
  if (history.length > WINDOW + 1) history.shift();
  const push = (name, value) => {
    series[name].push(value);
    if (series[name].length > KEEP) series[name].shift();
  };
  push("time", Date.now() / 1000);
  push("received", windowed("veil_received_publications_total"));
  push("matched", windowed("veil_matched_publications_total"));
  push("delivered", windowed("veil_deliveries_total"));
  push("p50", windowQuantile(0.5));
  push("p95", windowQuantile(0.95));
  push("p99", windowQuantile(0.99));
  push("lag", samples.get("veil_pipeline_lag") ?? null);
  push("queued", samples.get("veil_queued_deliveries") ?? null);
  push("sessionQueue", samples.get("veil_session_queue_depth") ?? null);
  push("connections", samples.get("veil_connections") ?? null);
  push("subscriptions", samples.get("veil_subscriptions") ?? null);
  push("batch", meanBatch());
  const s = series;
  charts.rates.setData([s.time, s.received, s.matched, s.delivered]);
  charts.latency.setData([s.time, s.p50, s.p95, s.p99]);
  charts.queues.setData([s.time, s.lag, s.queued, s.sessionQueue]);
  charts.clients.setData([s.time, s.connections, s.subscriptions]);
  charts.batches.setData([s.time, s.batch]);
}

function render(samples) {
  for (const element of document.querySelectorAll("[data-metric]")) {
    element.textContent = show(samples.get(element.dataset.metric), 0);
  }
  for (const element of document.querySelectorAll("[data-rate]")) {
    element.textContent = show(windowed(element.dataset.rate), 1);
  }
  for (const element of document.querySelectorAll("[data-quantile]")) {
    element.textContent = show(windowQuantile(Number(element.dataset.quantile)), 1);
  }
  const state = ["running", "starting", "restarting", "stuck"].find(
    (name) => samples.get(`veil_pipeline_state{state="${name}"}`) === 1) || "unknown";
  const pipeline = document.getElementById("pipeline");
  pipeline.textContent = state;
  pipeline.className = "state " + state;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function tick() {
  const error = document.getElementById("error");
  try {
    const response = await fetch("metrics", { cache: "no-store" });
    if (!response.ok) throw new Error(`/metrics answered ${response.status}`);
    const samples = parse(await response.text());
    record(samples);
    render(samples);
    window.veil.reads += 1;
    error.hidden = true;
  } catch (problem) {
    error.textContent = "cannot read /metrics: " + problem.message;
    error.hidden = false;
  }
  setTimeout(tick, INTERVAL);
}

window.veil = { charts, series, reads: 0 };  // for those who look from outside (the tests do)
tick();
