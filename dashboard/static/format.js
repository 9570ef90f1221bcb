// Formatting and DOM helpers shared by the dashboard's panels.
"use strict";

const H = (() => {
  /** Create an element: el("div", {class: "x", text: "hi"}, child, ...). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function num(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    const d = digits === undefined ? (Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 2) : digits;
    return x.toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: 0 });
  }

  function scaled(x, base, units) {
    let i = 0;
    let v = Math.abs(x);
    while (v >= base && i < units.length - 1) { v /= base; i += 1; }
    return `${num(Math.sign(x) * v)} ${units[i]}`;
  }

  /** A duration in seconds, as µs / ms / s / min. */
  function secs(s) {
    if (s === null || s === undefined) return "–";
    const a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return `${num(s * 1e6)} µs`;
    if (a < 1) return `${num(s * 1e3)} ms`;
    if (a < 120) return `${num(s)} s`;
    return `${num(s / 60)} min`;
  }

  const UNIT_FORMATS = {
    bytes: (v) => scaled(v, 1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]),
    flops: (v) => scaled(v, 1000, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"]),
    seconds: secs,
    tokens: (v) => `${num(v)} tokens`,
    pages: (v) => `${num(v)} pages`,
    forward_passes: (v) => `${num(v)} forward passes`,
    steps: (v) => `${num(v)} steps`,
    page_table_entries: (v) => `${num(v)} page-table entries`,
  };

  /** A value in a ledger unit, e.g. (1.5e9, "flops") -> "1.5 GFLOP". */
  function unit(v, u) {
    if (v === null || v === undefined) return "–";
    const f = UNIT_FORMATS[u];
    return f ? f(v) : `${num(v)} ${String(u).replaceAll("_", " ")}`;
  }

  function pct(x) {
    return x === null || x === undefined ? "–" : `${num(100 * x, 1)} %`;
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
  }

  function shortRid(rid) {
    const parts = String(rid).split("-");
    const hex = parts.length > 1 ? parts[1] : parts[0];
    return `${parts[0]}-${hex.slice(0, 6)}`;
  }

  async function getJSON(url) {
    const r = await fetch(url);
    const body = await r.json();
    if (!r.ok) throw new Error(body?.error?.message || `${r.status}`);
    return body;
  }

  return { el, num, secs, unit, pct, clock, shortRid, getJSON };
})();

const STAGE_COLORS = {
  tokenize: "#94a3b8",
  queue: "#f59e0b",
  "queue+prefill": "#fbbf24",
  prefill: "#3b82f6",
  decode: "#10b981",
  preempted: "#ef4444",
};

const VERB_COLORS = {
  skip: "#8b5cf6",
  compute_less: "#f97316",
  move_less: "#06b6d4",
  occupy_less: "#ca8a04",
  fill: "#16a34a",
  break_serial: "#db2777",
};

const PLOT_CONFIG = { displayModeBar: false, responsive: true };
const PLOT_FONT = { family: "Inter, system-ui, -apple-system, Segoe UI, sans-serif", size: 11, color: "#334155" };
