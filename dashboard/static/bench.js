// Benchmark runs: the list, and two runs side by side (settings, metrics, plots).
"use strict";

const Bench = (() => {
  let runs = [];
  let pick = { a: null, b: null };
  let latest = null; // the newest stored run, sweeps included
  const LAT = /^(mean|median|p\d+)_(\w+?)_ms$/;
  const THROUGHPUT = /(throughput|goodput)$/;

  /** Numeric leaves of a results object, as {"a.b": 1.5}. */
  function flatten(obj, prefix, out) {
    out = out || {};
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (typeof v === "number" && Number.isFinite(v)) out[key] = v;
      else if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
    }
    return out;
  }

  function table() {
    const t = document.getElementById("bench-table");
    const head = H.el("tr", {}, ["A", "B", "run", "when", "output tok/s", "p50 TTFT"].map((h) => H.el("th", { text: h })));
    const body = runs.map((r) => {
      const f = flatten(r.results);
      const radio = (which) => H.el("input", { type: "radio", name: `bench-${which}`, value: String(r.id),
        checked: pick[which] === r.id, onchange: () => { pick[which] = r.id; compare(); } });
      return H.el("tr", { "data-run": r.id }, H.el("td", {}, radio("a")), H.el("td", {}, radio("b")),
        H.el("td", { class: "name", text: r.name }), H.el("td", { text: new Date(r.created * 1000).toLocaleString() }),
        H.el("td", { text: H.num(f.output_throughput) }), H.el("td", { text: f.median_ttft_ms === undefined ? "–" : `${H.num(f.median_ttft_ms)} ms` }));
    });
    t.replaceChildren(head, ...body);
  }

  /** Grouped bars of metric keys ``cats`` (shown as ``names``) for runs A and B. */
  function chart(id, title, cats, names, a, b, unitLabel, log) {
    const traces = [];
    if (a) traces.push({ type: "bar", name: `A · ${a.name}`, x: names, y: cats.map((c) => a.vals[c]), marker: { color: "#94a3b8" } });
    traces.push({ type: "bar", name: `B · ${b.name}`, x: names, y: cats.map((c) => b.vals[c]), marker: { color: "#3b82f6" } });
    const div = H.el("div", { class: "bench-plot", id });
    const layout = { title: { text: title, font: { size: 12 } }, barmode: "group", height: 230, font: PLOT_FONT,
      margin: { l: 48, r: 8, t: 30, b: 30 }, legend: { orientation: "h", y: -0.18, font: { size: 10 } },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", yaxis: { title: { text: unitLabel }, gridcolor: "#eef2f7", type: log ? "log" : "linear" } };
    return { div, draw: () => Plotly.react(div, traces, layout, PLOT_CONFIG) };
  }

  function sideBySide(title, keys, a, b, fmt) {
    return H.el("table", { class: "tbl small" },
      H.el("tr", {}, H.el("th", { text: title }), H.el("th", { text: "A" }), H.el("th", { text: "B" }), H.el("th", { text: "B / A" })),
      keys.map((k) => {
        const va = a ? a[k] : undefined;
        const vb = b[k];
        const ratio = typeof va === "number" && typeof vb === "number" && va !== 0 ? vb / va : null;
        const diff = a && JSON.stringify(va) !== JSON.stringify(vb);
        return H.el("tr", { class: diff ? "diff" : "" }, H.el("td", { class: "mono", text: k }),
          H.el("td", { text: fmt(va) }), H.el("td", { text: fmt(vb) }), H.el("td", { text: ratio === null ? "" : `${H.num(ratio)}×` }));
      }));
  }

  function compare() {
    const box = document.getElementById("bench-compare");
    const b = runs.find((r) => r.id === pick.b) || runs[0];
    const a = runs.find((r) => r.id === pick.a && r.id !== b.id) || null;
    const fb = flatten(b.results);
    const fa = a ? flatten(a.results) : null;
    const charts = [];
    const metrics = {};
    for (const k of Object.keys(fb)) {
      const m = k.match(LAT);
      if (m) (metrics[m[2]] = metrics[m[2]] || []).push(k);
    }
    for (const [metric, keys] of Object.entries(metrics)) {
      const names = keys.map((k) => k.match(LAT)[1]);
      charts.push(chart(`bench-${metric}`, `${metric.toUpperCase()} (ms)`, keys, names,
        a && { name: a.name, vals: fa }, { name: b.name, vals: fb }, "ms", false));
    }
    const tput = Object.keys(fb).filter((k) => THROUGHPUT.test(k) && !k.includes("."));
    if (tput.length) {
      const names = tput.map((k) => k.replace(/_?throughput$/, "").replace(/_/g, " ") || k);
      charts.push(chart("bench-throughput", "Throughput (per second, log scale)", tput, names,
        a && { name: a.name, vals: fa }, { name: b.name, vals: fb }, "/ s", true));
    }
    const trend = runs.slice(0, 30).reverse();
    const trendDiv = H.el("div", { class: "bench-plot", id: "bench-trend" });
    const show = (v) => (v === undefined ? "–" : typeof v === "number" ? H.num(v) : typeof v === "object" ? JSON.stringify(v) : String(v));
    const settingKeys = [...new Set([...Object.keys(a ? a.settings : {}), ...Object.keys(b.settings)])].sort();
    box.replaceChildren(
      H.el("div", { class: "bench-title" }, H.el("span", { class: "chip a", text: a ? `A · ${a.name}` : "A · (pick a run)" }), " vs ", H.el("span", { class: "chip b", text: `B · ${b.name}` })),
      H.el("div", { class: "bench-plots" }, charts.map((c) => c.div), trendDiv),
      H.el("div", { class: "bench-tables" },
        sideBySide("setting", settingKeys, a ? a.settings : null, b.settings, show),
        sideBySide("result", Object.keys(fb).sort(), fa, fb, show)));
    charts.forEach((c) => c.draw());
    Plotly.react(trendDiv, [{ type: "bar", x: trend.map((r) => `${r.id}: ${r.name}`), y: trend.map((r) => flatten(r.results).output_throughput),
      marker: { color: trend.map((r) => (r.id === b.id ? "#3b82f6" : a && r.id === a.id ? "#94a3b8" : "#cbd5e1")) } }],
    { title: { text: "Output tokens/s by run", font: { size: 12 } }, height: 230, font: PLOT_FONT, margin: { l: 48, r: 8, t: 30, b: 60 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", xaxis: { tickangle: -20 }, yaxis: { gridcolor: "#eef2f7" } }, PLOT_CONFIG);
  }

  /** Load the stored runs (again) and draw them. */
  async function load() {
    try {
      const all = (await H.getJSON("/dashboard/api/bench")).runs;
      Sweeps.render(all);
      latest = all.length ? all[0].id : null;
      runs = all.filter((r) => !Sweeps.isSweep(r));
    } catch (e) {
      document.getElementById("bench-empty").textContent = `Benchmark runs unavailable: ${e.message}`;
      return;
    }
    document.getElementById("bench-empty").hidden = runs.length > 0;
    document.getElementById("bench").hidden = runs.length === 0;
    if (!runs.length) return;
    if (!runs.some((r) => r.id === pick.b)) pick.b = runs[0].id;
    if (!runs.some((r) => r.id === pick.a)) pick.a = runs.length > 1 ? runs[1].id : null;
    table();
    compare();
  }

  return { load, latestId: () => latest };
})();
