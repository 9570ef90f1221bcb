// The dashboard's wiring: the live WebSocket feed, the ledger window, first loads.
"use strict";

(() => {
  const state = { window: "300", limit: 40, ws: null, retry: 500, snapshots: 0 };

  function setConn(kind, text) {
    const c = document.getElementById("conn");
    c.dataset.state = kind;
    document.getElementById("conn-text").textContent = text;
  }

  function subscribe() {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify({ type: "subscribe", window: state.window, limit: state.limit }));
    }
  }

  function onSnapshot(s) {
    state.snapshots += 1;
    document.body.dataset.snapshots = String(state.snapshots);
    const e = s.live.engine;
    if (e && e.model) document.getElementById("model").textContent = e.model;
    setConn("live", s.live.engine ? "live" : "live · engine not answering");
    Live.render(s.live);
    Timeline.render(s.requests);
    Ledger.render(s.ledger);
    if (s.latest_bench_id !== Bench.latestId()) Bench.load();
  }

  function connect() {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${proto}://${location.host}/dashboard/ws`);
    state.ws = ws;
    ws.onopen = () => { state.retry = 500; setConn("live", "live"); subscribe(); };
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.type === "snapshot") onSnapshot(msg);
      else if (msg.type === "error") setConn("error", msg.error.message);
    };
    ws.onclose = () => {
      setConn("down", "reconnecting");
      setTimeout(connect, state.retry);
      state.retry = Math.min(state.retry * 2, 8000);
    };
  }

  function bindWindow() {
    const seg = document.getElementById("ledger-window");
    seg.addEventListener("click", async (ev) => {
      const b = ev.target.closest("button");
      if (!b) return;
      seg.querySelectorAll("button").forEach((x) => x.classList.toggle("on", x === b));
      state.window = b.dataset.window;
      subscribe();
      try {
        Ledger.render(await H.getJSON(`/dashboard/api/ledger?window=${state.window}`));
      } catch (e) {
        setConn("error", e.message);
      }
    });
  }

  function bindMode() {
    const seg = document.getElementById("timeline-mode");
    seg.addEventListener("click", (ev) => {
      const b = ev.target.closest("button");
      if (!b) return;
      seg.querySelectorAll("button").forEach((x) => x.classList.toggle("on", x === b));
      Timeline.setMode(b.dataset.mode);
    });
  }

  bindWindow();
  bindMode();
  Bench.load();
  connect();
})();
