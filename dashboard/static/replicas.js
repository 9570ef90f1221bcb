// houchu replicas page: polls /dashboard/api/replicas every second and draws one row per
// replica (state, load, prefix hit rate) and the router's policy.
"use strict";

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  return td;
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function routerView(r) {
  if (!r) return "not registered";
  return `${r.status}${r.is_healthy ? "" : " (unhealthy)"}, load ${r.load}`;
}

function row(rep) {
  const tr = document.createElement("tr");
  tr.dataset.state = rep.state;
  const rate = rep.prefix_hit_rate === null || rep.prefix_hit_rate === undefined
    ? null : `${(100 * rep.prefix_hit_rate).toFixed(1)} %`;
  const where = rep.device && rep.device.startsWith("cuda")
    ? rep.device : (rep.cores ? `cores ${rep.cores.join(",")}` : "shared cores");
  for (const v of [rep.index, rep.state, rep.health, routerView(rep.router), rep.num_running,
    rep.num_waiting, rep.num_finished, rate, rep.restarts, `${where}, ${rep.threads} threads`]) {
    tr.appendChild(cell(v));
  }
  const links = document.createElement("td");
  links.appendChild(link(rep.dashboard_url, "dashboard"));
  links.appendChild(document.createTextNode(" · "));
  links.appendChild(link(rep.metrics_url, "/metrics"));
  tr.appendChild(links);
  return tr;
}

async function refresh() {
  try {
    const resp = await fetch("/dashboard/api/replicas");
    const snap = await resp.json();
    document.getElementById("policy").textContent = `policy ${snap.policy}`;
    document.getElementById("router").textContent = `router ${snap.router.url} (${snap.router.state})`;
    const body = document.querySelector("#replicas tbody");
    body.replaceChildren(...snap.replicas.map(row));
    const at = snap.polled_at ? new Date(snap.polled_at * 1000).toLocaleTimeString() : "never";
    document.getElementById("polled").textContent = `polled ${at}`;
  } catch (err) {
    document.getElementById("polled").textContent = `not reachable: ${err}`;
  }
}

refresh();
setInterval(refresh, 1000);
