// Lever sweeps stored by `houchu levers`: the composition matrix as a heat map and each
// lever's throughput gain as a curve over load.
"use strict";

const Sweeps = (() => {
  let sweeps = [];
  let picked = null;
  const VERDICT_COLOR = { add: "#16a34a", overlap: "#ca8a04", cancel: "#dc2626", synergy: "#2563eb", noisy: "#64748b" };

  function isSweep(r) {
    return (r.results || {}).kind === "lever_sweep";
  }

  /** The pair matrix of a sweep's answers: levers on both axes, z = pair / (a × b). */
  function heatmap(div, answers) {
    const names = answers.levers.map((l) => l.lever);
    const z = names.map(() => names.map(() => null));
    const text = names.map(() => names.map(() => ""));
    for (const p of answers.matrix) {
      const i = names.indexOf(p.a);
      const j = names.indexOf(p.b);
      if (i < 0 || j < 0) continue;
      const label = `${p.verdict} ${H.num(p.ratio)} (${H.num(p.gain_ab)}× vs ${H.num(p.gain_a)}×·${H.num(p.gain_b)}×)`;
      z[i][j] = z[j][i] = p.ratio;
      text[i][j] = text[j][i] = label;
    }
    const trace = { type: "heatmap", x: names, y: names, z, text, hoverinfo: "text+x+y", texttemplate: "%{text}",
      colorscale: [[0, "#dc2626"], [0.5, "#f8fafc"], [1, "#2563eb"]], zmid: 1, zmin: 0.5, zmax: 1.5,
      colorbar: { title: { text: "a+b / (a×b)" } } };
    const layout = { title: { text: `Composition at load ${answers.target_load}`, font: { size: 12 } }, height: 320,
      font: PLOT_FONT, margin: { l: 110, r: 8, t: 30, b: 80 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)" };
    Plotly.react(div, [trace], layout, PLOT_CONFIG);
    div.dataset.pairs = String(answers.matrix.length);
  }

  /** Each lever's throughput gain over the baseline at every load (1× dashed). */
  function curves(div, answers, loads) {
    const traces = answers.levers.map((l) => ({ type: "scatter", mode: "lines+markers", name: l.lever,
      x: l.loads.map((p) => p.load), y: l.loads.map((p) => p.gain.throughput) }));
    const layout = { title: { text: "Throughput gain over the baseline by load", font: { size: 12 } }, height: 320,
      font: PLOT_FONT, margin: { l: 48, r: 8, t: 30, b: 40 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      xaxis: { type: "log", title: { text: "load" }, tickvals: loads }, yaxis: { title: { text: "× baseline" }, gridcolor: "#eef2f7" },
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { dash: "dash", color: "#94a3b8" } }],
      legend: { orientation: "h", y: -0.4, font: { size: 10 } } };
    Plotly.react(div, traces, layout, PLOT_CONFIG);
  }

  function summary(answers, settings) {
    const rec = answers.recommendation;
    const rows = answers.levers.map((l) => H.el("tr", {}, H.el("td", { class: "mono", text: l.lever }),
      H.el("td", { text: l.bottleneck }), H.el("td", { text: l.break_even.text })));
    const na = Object.entries(answers.not_applicable || {}).map(([k, why]) => H.el("tr", {},
      H.el("td", { class: "mono", text: k }), H.el("td", { text: "not applicable" }), H.el("td", { text: why })));
    const verdicts = answers.matrix.map((p) => H.el("span", { class: "chip", style: `color:${VERDICT_COLOR[p.verdict] || "inherit"}`,
      text: `${p.a} + ${p.b}: ${p.verdict}` }));
    return H.el("div", { class: "bench-tables" },
      H.el("table", { class: "tbl small" }, H.el("tr", {}, ["lever", "targets", "break-even"].map((h) => H.el("th", { text: h }))), rows, na),
      H.el("div", { class: "sweep-summary" }, recommendation(rec, settings),
        H.el("div", { class: "sweep-verdicts" }, verdicts.length ? verdicts : H.el("span", { class: "muted", text: "no pairs measured" }))));
  }

  /** The recommended configuration: its serve flags (houchu's defaults: none), what to
   *  expect, and how it compares with the defaults. */
  function recommendation(rec, settings) {
    if (!rec) return H.el("div", { text: "No recommendation: nothing was measured at the target load" });
    const m = rec.metrics || {};
    const num = (v, unit) => (v == null ? "-" : `${v.toFixed(1)} ${unit}`);
    const serveArgs = (settings.serve_args || []).join(" ");
    const model = settings.model ? `--model ${settings.model} ` : "";
    const flags = `${model}${serveArgs} ${rec.flags.join(" ")}`.trim()
      + (rec.config === "defaults" ? "  (houchu's defaults: no lever flag)" : "");
    const noise = rec.defaults_tolerance != null && rec.against_defaults != null
      && Math.abs(rec.against_defaults - 1) <= rec.defaults_tolerance;
    const vs = rec.config === "defaults" ? "the fastest measured"
      : rec.against_defaults == null ? ""
      : `${rec.against_defaults.toFixed(2)}x houchu's defaults${noise ? `, within the repeats' spread (±${Math.round(100 * rec.defaults_tolerance)}%): no clear gain` : ""}`;
    return H.el("div", { id: "sweep-recommendation" },
      H.el("div", { text: `Recommended at load ${rec.load}: ${rec.config}${vs ? ` (${vs})` : ""}` }),
      H.el("div", { class: "mono wrap", text: `houchu serve ${flags}` }),
      H.el("div", { class: "muted", text: `expected: TTFT ${num(m.median_ttft_ms, "ms")}, TPOT ${num(m.median_tpot_ms, "ms")}, ${num(m.output_throughput, "output tok/s")}` }));
  }

  function draw() {
    const box = document.getElementById("sweeps");
    const run = sweeps.find((r) => r.id === picked) || sweeps[0];
    const answers = run.results.answers;
    const select = H.el("select", { id: "sweep-pick", onchange: (e) => { picked = Number(e.target.value); draw(); } },
      sweeps.map((r) => H.el("option", { value: String(r.id), text: `${r.id}: ${r.name}`, selected: r.id === run.id })));
    const heat = H.el("div", { class: "bench-plot", id: "sweep-heatmap" });
    const curve = H.el("div", { class: "bench-plot", id: "sweep-curves" });
    box.replaceChildren(select, H.el("div", { class: "bench-plots" }, heat, curve), summary(answers, run.settings || {}));
    heatmap(heat, answers);
    curves(curve, answers, run.settings.loads || []);
    box.dataset.run = String(run.id);
  }

  /** Show the sweeps among the stored runs ``runs`` (from /dashboard/api/bench). */
  function render(runs) {
    sweeps = runs.filter(isSweep);
    document.getElementById("sweeps-empty").hidden = sweeps.length > 0;
    document.getElementById("sweeps").hidden = sweeps.length === 0;
    if (sweeps.length) draw();
  }

  return { isSweep, render };
})();
