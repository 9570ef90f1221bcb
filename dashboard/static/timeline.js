// The request timeline: a Gantt chart of recent requests (Plotly), and a request's detail.
"use strict";

const Timeline = (() => {
  const TZ_MS = new Date().getTimezoneOffset() * 60000;
  let mode = "clock"; // or "relative": seconds since each request arrived
  const origin = (r) => r.arrived_at || r.started_at;
  // Plotly date axes show UTC: shift to local time. Relative mode: seconds since arrival.
  const axisTime = (t, r) => (mode === "clock" ? t * 1000 - TZ_MS : t - origin(r));
  const axisSpan = (s) => (mode === "clock" ? Math.max(s * 1000, 1) : Math.max(s, 0.001));
  const MARKERS = {
    prefix_matched: { symbol: "diamond", color: VERB_COLORS.skip, size: 11, name: "prefix hit" },
    prefill_chunk: { symbol: "line-ns-open", color: "#1e3a8a", size: 12, name: "prefill chunk" },
    first_token: { symbol: "circle", color: "#0f172a", size: 7, name: "first token" },
    preempted: { symbol: "x", color: "#b91c1c", size: 10, name: "preempted" },
    resumed: { symbol: "triangle-right", color: "#b91c1c", size: 9, name: "resumed" },
    finished: { symbol: "line-ns-open", color: "#0f172a", size: 16, name: "finished" },
    aborted: { symbol: "x-thin-open", color: "#ea580c", size: 12, name: "aborted" },
    failed: { symbol: "x-thin-open", color: "#dc2626", size: 12, name: "failed" },
    lost: { symbol: "square-open", color: "#64748b", size: 9, name: "no end recorded" },
  };
  let selected = null;
  let rows = [];

  // A choice of an n > 1 / best_of request: "#i/k" (its rid's prefix is its parent's).
  const choiceTag = (r) => (r.choice ? ` #${r.choice.index}/${r.choice.of}` : "");
  // Keys of ``params`` shown by the choice line instead of the parameter grid.
  const CHOICE_KEYS = new Set(["parent", "choice", "choices"]);

  function label(r) {
    const text = (r.preview || "").slice(0, 20);
    return `${H.shortRid(r.rid)}${choiceTag(r)}  ${text}`;
  }

  /** "choice i of k of <parent>", with a link to each other choice in the timeline. */
  function choiceLine(d) {
    const c = d.choice;
    if (!c) return null;
    const best = c.n != null && c.n < c.of ? ` (the best ${c.n} returned)` : "";
    const others = rows.filter((r) => r.choice && r.choice.parent === c.parent && r.rid !== d.rid)
      .map((r) => H.el("button", { class: "choice-link", text: `#${r.choice.index}`, onclick: () => show(r.rid) }));
    return H.el("p", { class: "choice-of", "data-parent": c.parent },
      H.el("span", { text: `choice #${c.index} of ${c.of}${best} of ` }), H.el("span", { class: "mono", text: c.parent }),
      others.length ? H.el("span", { text: " · other choices: " }) : null, ...others);
  }

  function stageTraces(reqs) {
    const traces = [];
    for (const stage of Object.keys(STAGE_COLORS)) {
      const t = { type: "bar", orientation: "h", name: stage, y: [], x: [], base: [], customdata: [],
        marker: { color: STAGE_COLORS[stage], line: { width: 0 } }, width: 0.62,
        hovertemplate: "%{customdata[1]}<br>%{customdata[2]}<extra>%{customdata[3]}</extra>" };
      for (const r of reqs) {
        for (const s of r.segments) {
          if (s.stage !== stage) continue;
          t.y.push(label(r));
          t.base.push(axisTime(s.start, r));
          t.x.push(axisSpan(s.end - s.start));
          t.customdata.push([r.rid, `${stage}${s.open ? " (running)" : ""}`, H.secs(s.end - s.start), H.shortRid(r.rid)]);
        }
      }
      if (t.y.length) traces.push(t);
    }
    return traces;
  }

  function markerTraces(reqs) {
    const groups = {};
    for (const r of reqs) {
      for (const m of r.markers) {
        const key = m.kind === "lever" ? `lever:${m.verb}` : m.kind;
        const style = m.kind === "lever"
          ? { symbol: "star", color: VERB_COLORS[m.verb] || "#64748b", size: 12, name: `lever: ${m.verb}` }
          : MARKERS[m.kind];
        if (!style) continue;
        const g = groups[key] || (groups[key] = { type: "scatter", mode: "markers", name: style.name,
          x: [], y: [], customdata: [], hovertemplate: "%{customdata[1]}<extra></extra>",
          marker: { symbol: style.symbol, color: style.color, size: style.size, line: { width: 1.5, color: style.color } } });
        g.x.push(axisTime(m.t, r));
        g.y.push(label(r));
        g.customdata.push([r.rid, m.label]);
      }
    }
    return Object.values(groups);
  }

  function legend() {
    const box = document.getElementById("stage-legend");
    if (box.childElementCount) return;
    for (const [stage, color] of Object.entries(STAGE_COLORS)) {
      box.append(H.el("span", { class: "legend-item" }, H.el("i", { style: `background:${color}` }), stage));
    }
    box.append(H.el("span", { class: "legend-item" }, H.el("b", { class: "star", style: `color:${VERB_COLORS.skip}` }, "★"), "lever acted"));
  }

  /** Draw the timeline of ``reqs`` (newest first). */
  function render(reqs) {
    rows = reqs;
    legend();
    const div = document.getElementById("timeline");
    document.getElementById("timeline-empty").hidden = reqs.length > 0;
    div.hidden = reqs.length === 0;
    div.dataset.rows = String(reqs.length);
    div.dataset.stages = [...new Set(reqs.flatMap((r) => r.segments.map((s) => s.stage)))].join(",");
    if (!reqs.length) return;
    const labels = reqs.map(label);
    const layout = {
      barmode: "overlay", showlegend: false, height: (mode === "clock" ? 56 : 76) + 24 * reqs.length,
      margin: { l: 260, r: 16, t: 8, b: 36 }, font: PLOT_FONT, uirevision: mode,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fbfcfe", hoverlabel: { font: PLOT_FONT },
      xaxis: mode === "clock"
        ? { type: "date", gridcolor: "#e2e8f0", tickformat: "%H:%M:%S", hoverformat: "%H:%M:%S.%L" }
        : { type: "linear", gridcolor: "#e2e8f0", ticksuffix: " s", title: { text: "seconds since arrival", font: { size: 11 } } },
      yaxis: { type: "category", categoryorder: "array", categoryarray: labels, autorange: "reversed",
        tickfont: { family: "ui-monospace, SFMono-Regular, Menlo, monospace", size: 11 } },
    };
    Plotly.react(div, [...stageTraces(reqs), ...markerTraces(reqs)], layout, PLOT_CONFIG);
    if (!div.dataset.bound) {
      div.dataset.bound = "1";
      div.on("plotly_click", (ev) => { const p = ev.points && ev.points[0]; if (p && p.customdata) show(p.customdata[0]); });
    }
    if (selected && reqs.some((r) => r.rid === selected && r.status === "running")) show(selected);
  }

  const MASK_TIME_NOTE = "Its share of each step's grammar mask time. A step's batched masks "
    + "(one llguidance call) are shared by each request's masks timed alone on earlier steps: an estimate.";
  function kv(k, v, attrs) { return H.el("div", { class: "kv", ...attrs }, H.el("span", { class: "k", text: k }), H.el("span", { class: "v", text: v })); }

  function detailBody(d) {
    const t0 = d.arrived_at || d.started_at;
    const ledger = d.ledger.length
      ? H.el("table", { class: "tbl small" }, H.el("tr", {}, ["lever", "verb", "saved", "spent"].map((h) => H.el("th", { text: h }))),
        d.ledger.map((l) => H.el("tr", {}, H.el("td", { text: l.lever }), H.el("td", {}, H.el("span", { class: "verb-chip", style: `--c:${VERB_COLORS[l.verb] || "#64748b"}`, text: l.verb })),
          H.el("td", { text: H.unit(l.saved, l.saved_unit) }), H.el("td", { text: l.spent_unit ? H.unit(l.spent, l.spent_unit) : "–" }))))
      : H.el("p", { class: "muted", text: "No lever reported a saving for this request." });
    const events = H.el("table", { class: "tbl small events" },
      H.el("tr", {}, ["+time", "event", "actor", "data"].map((h) => H.el("th", { text: h }))),
      d.events.map((e) => H.el("tr", {}, H.el("td", { text: H.secs(e.t - t0) }), H.el("td", { text: e.kind }), H.el("td", { text: e.actor }),
        H.el("td", { class: "mono", text: Object.entries(e.data).filter(([k]) => k !== "preview").map(([k, v]) => `${k}=${typeof v === "number" && k.endsWith("_t") ? H.clock(v) : v}`).join(" ") }))));
    return [
      H.el("div", { class: "detail-head" }, H.el("h3", { class: "mono", text: d.rid }), H.el("button", { class: "close", text: "×", onclick: () => { selected = null; setDetailVisible(false); } })),
      H.el("p", { class: "preview", text: d.preview || "" }),
      choiceLine(d),
      H.el("div", { class: "kvs" },
        kv("status", `${d.status}${d.finish_reason ? ` (${d.finish_reason})` : ""}`),
        kv("prompt tokens", H.num(d.prompt_tokens)), kv("cached tokens", H.num(d.cached_tokens)),
        kv("completion tokens", H.num(d.completion_tokens)), kv("TTFT", H.secs(d.ttft_s)),
        kv("TPOT", H.secs(d.tpot_s)), kv("E2E", H.secs(d.e2e_s)), kv("preemptions", H.num(d.num_preemptions)),
        d.structured ? kv("grammar", d.structured.kind) : null,
        d.structured ? kv("mask time", H.secs(d.structured.mask_s), { title: MASK_TIME_NOTE }) : null),
      d.error ? H.el("p", { class: "error", text: d.error }) : null,
      H.el("h4", { text: "Parameters" }),
      H.el("div", { class: "kvs params" }, Object.entries(d.params).filter(([k]) => !CHOICE_KEYS.has(k))
        .map(([k, v]) => kv(k, String(v), { "data-param": k }))),
      H.el("h4", { text: "Its ledger" }), ledger,
      H.el("h4", { text: "Events" }), events,
    ];
  }

  /** Fetch and show one request's detail. */
  async function show(rid) {
    selected = rid;
    const box = document.getElementById("detail");
    try {
      const d = await H.getJSON(`/dashboard/api/requests/${encodeURIComponent(rid)}`);
      if (selected !== rid) return;
      box.replaceChildren(...detailBody(d).filter(Boolean));
      box.dataset.rid = rid;
    } catch (e) {
      box.replaceChildren(H.el("p", { class: "error", text: `Could not load ${rid}: ${e.message}` }));
    }
    setDetailVisible(true);
  }

  function setDetailVisible(on) {
    const box = document.getElementById("detail");
    if (box.hidden === !on) return;
    box.hidden = !on;
    const div = document.getElementById("timeline");
    if (!div.hidden && div.data) Plotly.Plots.resize(div);
  }

  /** Switch the time axis: "clock" (wall-clock) or "relative" (since each arrival). */
  function setMode(m) {
    mode = m;
    render(rows);
  }

  return { render, show, setMode, rows: () => rows };
})();
