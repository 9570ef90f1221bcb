// Live numbers (tiles and small time series) and the lever ledger.
"use strict";

const Live = (() => {
  const history = { t: [], running: [], waiting: [], pages: [], roundTrip: [] }; // pushed engine counters
  const HISTORY_S = 120;

  function tile(id, label, value, sub) {
    return H.el("div", { class: "kpi", id: `kpi-${id}`, "data-value": value },
      H.el("div", { class: "kpi-label", text: label }),
      H.el("div", { class: "kpi-value", text: value }),
      H.el("div", { class: "kpi-sub", text: sub || "" }));
  }

  function kvTile(kv) {
    const dev = kv.find((k) => k.tier === "device");
    if (!dev) return tile("kv", "KV pages", "–", "engine not answering");
    const used = dev.used || 0;
    const cached = dev.cached || 0;
    const node = tile("kv", "KV pages (device)", `${H.num(used + cached)} / ${H.num(dev.total)}`,
      `${H.num(used)} running · ${H.num(cached)} cached prefixes`);
    const bar = H.el("div", { class: "bar" },
      H.el("i", { class: "used", style: `width:${(100 * used) / dev.total}%` }),
      H.el("i", { class: "cached", style: `width:${(100 * cached) / dev.total}%` }));
    node.append(bar);
    for (const k of kv.filter((x) => x.tier !== "device")) {
      const pages = k.total === null ? `${H.num(k.used)} pages` : `${H.num(k.used)} / ${H.num(k.total)} pages`;
      const bytes = k.bytes === null || k.bytes === undefined ? ""
        : ` · ${H.unit(k.bytes, "bytes")}${k.capacity_bytes ? ` / ${H.unit(k.capacity_bytes, "bytes")}` : ""}`;
      node.append(H.el("div", { class: "kpi-sub tier", "data-tier": k.tier, text: `${k.tier}: ${pages}${bytes}` }));
    }
    return node;
  }

  function tiles(live) {
    const e = live.engine || {};
    const r = live.rates;
    const q = live.requests;
    const drops = ["dropped_by_actors", "dropped_by_recorder", "dropped_by_errors"].reduce((a, k) => a + (live.counters[k] || 0), 0);
    const hit = e.prefix_hit_rate !== undefined ? e.prefix_hit_rate : q.prefix_hit_rate;
    return [
      tile("running", "Running", live.engine ? H.num(e.num_running) : "–", live.engine ? "requests in the batch" : live.engine_error),
      tile("queued", "Queued", live.engine ? H.num(e.num_waiting) : "–", "waiting for admission"),
      tile("preempted", "Preemptions", live.engine ? H.num(e.num_preemptions || 0) : "–", "KV dropped to make room, recomputed on resume"),
      tile("batch", "Batch size", H.num(r.batch_size), "requests per forward pass"),
      tile("prefill_tps", "Tokens/s in", H.num(r.prefill_tps), "prefill tokens computed"),
      tile("decode_tps", "Tokens/s out", H.num(r.decode_tps), "decode tokens computed"),
      tile("step", "Step time", r.step_ms === null ? "–" : `${H.num(r.step_ms)} ms`,
        (r.round_trip_ms === null ? "runner compute" : `${H.num(r.round_trip_ms)} ms scheduler round trip`)
        + (r.allreduce_ms === null || r.allreduce_ms === undefined ? "" : ` · ${H.num(r.allreduce_ms)} ms all-reduce`)),
      kvTile(live.kv),
      tile("hit", "Prefix hit rate", H.pct(hit), "prompt tokens reused"),
      tile("finished", "Requests", H.num(q.by_status.finished || 0),
        `finished · ${H.num(q.by_status.running || 0)} running · ${H.num((q.by_status.aborted || 0) + (q.by_status.failed || 0))} aborted/failed`),
      tile("ttft", "TTFT (5 min)", H.secs(q.ttft_s), `TPOT ${H.secs(q.tpot_s)} · E2E ${H.secs(q.e2e_s)}`),
      tile("drops", "Telemetry", H.num(live.counters.records_written || 0), `records written · ${H.num(drops)} dropped`),
    ];
  }

  function remember(live) {
    const e = live.engine;
    if (!e) return;
    const now = live.now * 1000 - new Date().getTimezoneOffset() * 60000;
    history.t.push(now);
    history.running.push(e.num_running);
    history.waiting.push(e.num_waiting);
    history.pages.push((e.num_pages_used || 0) + (e.num_pages_cached || 0));
    history.roundTrip.push(e.round_trip_ms === undefined ? null : e.round_trip_ms);
    while (history.t.length && history.t[0] < now - HISTORY_S * 1000) {
      for (const k of Object.keys(history)) history[k].shift();
    }
  }

  function spark(id, traces) {
    const layout = { height: 130, margin: { l: 36, r: 8, t: 4, b: 22 }, font: PLOT_FONT, showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.12, font: { size: 10 } }, uirevision: id,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      xaxis: { type: "date", tickformat: "%H:%M:%S", gridcolor: "#eef2f7", nticks: 4 },
      yaxis: { gridcolor: "#eef2f7", rangemode: "tozero", nticks: 4 } };
    Plotly.react(id, traces, layout, PLOT_CONFIG);
  }

  function line(x, y, name, color, extra) {
    return { type: "scatter", mode: "lines", x, y, name, line: { color, width: 1.8, shape: "hv" }, connectgaps: false, ...(extra || {}) };
  }

  function ratio(x) {
    return x === null || x === undefined ? "–" : `${H.num(x, 2)} ×`;
  }

  /** The MoE expert-load panel (hidden for a dense model): imbalance tiles, its series
   * and a layers × experts heat map of the tokens each expert received. */
  function experts(load, x, series) {
    const box = document.getElementById("experts");
    box.hidden = !load;
    if (!load) return;
    box.dataset.imbalance = load.last.imbalance === null ? "" : String(load.last.imbalance);
    box.dataset.steps = String(load.steps);
    document.getElementById("expert-kpis").replaceChildren(
      tile("imbalance-last", "Imbalance (last step)", ratio(load.last.imbalance),
        `step ${load.last.step_id}: its busiest expert against the mean (1 × is even)`),
      tile("imbalance-window", "Imbalance (60 s)", ratio(load.imbalance_mean),
        `mean of ${H.num(load.steps)} steps · worst ${ratio(load.imbalance_max)}`),
      tile("experts", "Routed experts", `${H.num(load.layers)} × ${H.num(load.experts)}`,
        "MoE layers × experts per layer"));
    spark("spark-imbalance", [line(x, series, "imbalance", "#ef4444")]);
    const layers = load.tokens.map((_, i) => `layer ${i}`);
    Plotly.react("expert-heat", [{ type: "heatmap", z: load.tokens, y: layers, colorscale: "Blues",
      hovertemplate: "%{y}, expert %{x}: %{z} tokens<extra></extra>" }],
      { height: 130, margin: { l: 56, r: 8, t: 4, b: 22 }, font: PLOT_FONT,
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", uirevision: "expert-heat" }, PLOT_CONFIG);
  }

  /** The tensor-parallel panel (hidden for a tp 1 runner): the collectives' time per
   * step, as tiles (the last step; the last 10 s) and stacked bars of the last steps. */
  function tensorParallel(steps, rates) {
    const box = document.getElementById("tp-steps");
    const tp = (steps || []).filter((s) => s.allreduce_ms !== null);
    box.hidden = !tp.length;
    if (!tp.length) return;
    const last = tp[tp.length - 1];
    box.dataset.steps = String(tp.length);
    box.dataset.lastAllreduceMs = String(last.allreduce_ms);
    document.getElementById("tp-kpis").replaceChildren(
      tile("allreduce-last", "All-reduce (last step)", `${H.num(last.allreduce_ms, 2)} ms`,
        `step ${last.step_id} (${last.phase}, batch ${last.batch_size}): ${H.pct(last.allreduce_ms / last.step_ms)} of its ${H.num(last.step_ms, 2)} ms`),
      tile("allreduce-mean", "All-reduce per step (10 s)",
        rates.allreduce_ms === null ? "–" : `${H.num(rates.allreduce_ms, 2)} ms`,
        rates.allreduce_share === null ? "no step in the last 10 s" : `${H.pct(rates.allreduce_share)} of the step time`));
    const x = tp.map((s) => String(s.step_id));
    const custom = tp.map((s) => [s.phase, s.batch_size, H.num(s.step_ms, 2)]);
    const bar = (name, y, color) => ({ type: "bar", name, x, y, customdata: custom, marker: { color },
      hovertemplate: `step %{x} (%{customdata[0]}, batch %{customdata[1]}): ${name} %{y:.2f} ms of %{customdata[2]} ms<extra></extra>` });
    Plotly.react("tp-step-bars", [
      bar("compute", tp.map((s) => Math.max(s.step_ms - s.allreduce_ms, 0)), "#0ea5e9"),
      bar("all-reduce", tp.map((s) => s.allreduce_ms), "#f97316"),
    ], { height: 150, barmode: "stack", margin: { l: 36, r: 8, t: 4, b: 28 }, font: PLOT_FONT, showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.14, font: { size: 10 } }, uirevision: "tp-step-bars",
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      xaxis: { type: "category", title: { text: "step", font: { size: 10 } }, nticks: 12 },
      yaxis: { gridcolor: "#eef2f7", rangemode: "tozero", nticks: 4 } }, PLOT_CONFIG);
  }

  /** Update tiles and series from a live snapshot. */
  function render(live) {
    document.getElementById("kpis").replaceChildren(...tiles(live));
    remember(live);
    const s = live.series;
    const x = s.t.map((t) => t * 1000 - new Date().getTimezoneOffset() * 60000);
    spark("spark-tps", [line(x, s.prefill_tps, "in (prefill)", "#3b82f6"), line(x, s.decode_tps, "out (decode)", "#10b981")]);
    spark("spark-batch", [line(x, s.batch_size, "batch", "#8b5cf6")]);
    const stepLines = [line(x, s.step_ms, "compute", "#0ea5e9"), line(history.t, history.roundTrip, "round trip", "#94a3b8")];
    if ((s.allreduce_ms || []).some((v) => v !== null)) stepLines.push(line(x, s.allreduce_ms, "all-reduce", "#f97316"));
    spark("spark-step", stepLines);
    spark("spark-req", [line(x, s.in_flight, "in flight", "#f59e0b"),
      line(history.t, history.running, "running", "#10b981"), line(history.t, history.waiting, "queued", "#ef4444"),
      line(history.t, history.pages, "KV pages", "#64748b", { yaxis: "y", line: { dash: "dot", color: "#64748b", width: 1.2 } })]);
    experts(live.expert_load, x, s.expert_imbalance);
    tensorParallel(live.steps, live.rates);
  }

  return { render };
})();

const Ledger = (() => {
  function amounts(map, headline) {
    const units = Object.keys(map);
    if (!units.length) return "–";
    return units.map((u) => {
      const a = map[u];
      const v = headline === "mean" ? a.mean : headline === "max" ? a.max : a.sum;
      return H.unit(v, u) + (headline === "sum" ? "" : ` (${headline})`);
    }).join(" · ");
  }

  function leverRow(l) {
    const savedTokens = l.saved.tokens ? l.saved.tokens.sum : 0;
    return H.el("div", { class: `lever${l.active ? "" : " idle"}`, "data-lever": l.lever, "data-saved-tokens": savedTokens, "data-samples": l.samples },
      H.el("div", { class: "lever-head" },
        H.el("span", { class: "lever-title", text: l.title }),
        H.el("span", { class: "lever-name mono", text: l.lever }),
        H.el("span", { class: "lever-samples", text: l.active ? `${H.num(l.samples)} samples` : "no samples yet" })),
      H.el("div", { class: "lever-line", text: l.line }),
      H.el("div", { class: "lever-amounts" },
        H.el("div", { class: "saved" }, H.el("span", { class: "tag", text: "saved" }), H.el("span", { class: "amt", text: l.active ? amounts(l.saved, l.headline) : l.saves || "–" })),
        H.el("div", { class: "spent" }, H.el("span", { class: "tag", text: "spent" }), H.el("span", { class: "amt", text: spentText(l) }))),
      l.spends ? H.el("div", { class: "lever-cost", text: `costs: ${l.spends}` }) : null);
  }

  /** A lever's spent amounts; "not measured" where the catalog says no counter measures
   * its cost (never a 0 in some unit). */
  function spentText(l) {
    if (!l.spent_measured) return "not measured";
    return l.active ? amounts(l.spent, l.headline) : "–";
  }

  /** Render the ledger (verbs, each with its levers). */
  function render(ledger) {
    const box = document.getElementById("ledger");
    box.dataset.window = ledger.window_s === null ? "all" : String(ledger.window_s);
    box.replaceChildren(...ledger.verbs.map((v) => {
      const active = v.levers.filter((l) => l.active).length;
      return H.el("div", { class: "verb", "data-verb": v.verb, style: `--c:${VERB_COLORS[v.verb] || "#64748b"}` },
        H.el("div", { class: "verb-head" },
          H.el("span", { class: "verb-title", text: v.title }),
          H.el("span", { class: "verb-count", text: `${active} / ${v.levers.length} active` })),
        H.el("div", { class: "verb-what", text: `${v.what}${v.bottleneck ? ` — targets ${v.bottleneck}` : ""}` }),
        v.levers.map(leverRow));
    }));
  }

  return { render };
})();
