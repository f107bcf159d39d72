// The live page of `hpcrun serve`: every few seconds fetch /api/summary.json and put its
// numbers in place. Text goes in with textContent only (never innerHTML), so nothing from the
// store can become markup.
"use strict";
(function () {
  const every = 1000 * Number(document.currentScript.dataset.refresh || 30);
  const text = (id, value) => { const el = document.getElementById(id); if (el) el.textContent = String(value); };
  function rows(tableId, header, items) {
    const table = document.getElementById(tableId);
    if (!table) return;
    while (table.rows.length > 1) table.deleteRow(1);
    for (const cells of items) {
      const tr = table.insertRow();
      cells.forEach((c, i) => { const td = tr.insertCell(); td.textContent = String(c); if (i === 1) td.className = "num"; });
    }
  }
  function beat(h) {
    const el = document.getElementById("beat");
    if (!h) { el.textContent = "No supervisor has run this campaign (`hpcrun run`)."; el.className = "stale"; return; }
    el.textContent = `Supervisor ${h.holder}: ${h.phase}, round ${h.rounds}, last heartbeat ${h.age_s} s ago (${h.at}). ${h.note}`;
    el.className = h.age_s > 3 * (h.pause_s || 60) + 60 ? "stale" : "";
  }
  function show(s) {
    text("generated", s.generated_at);
    text("done", s.inputs.done); text("total", s.inputs_total); text("succeeded", s.succeeded);
    text("parked", s.inputs.parked); text("inflight", s.jobs.submitted + s.jobs.running);
    text("top", s.chart.top); text("span", `${s.chart.start || "-"} to ${s.chart.end || "-"}`);
    document.getElementById("line-completed").setAttribute("points", s.chart.completed);
    document.getElementById("line-qa").setAttribute("points", s.chart.qa);
    document.getElementById("line-forecast").setAttribute("points", s.chart.forecast);
    text("forecast", s.forecast);
    document.getElementById("footprint-part").hidden = !s.footprint.length;
    rows("footprint", true, s.footprint.map(f => [f.cells.where, f.cells.now, f.cells.end, f.cells.peak, f.cells.quota]));
    for (const td of document.querySelectorAll("#jobs td[data-state]")) td.textContent = String(s.jobs[td.dataset.state]);
    const merit = document.getElementById("merit");
    while (merit.rows.length) merit.deleteRow(0);
    for (const [label, value] of s.merit) {
      const tr = merit.insertRow(); const th = document.createElement("th"); th.textContent = label; tr.appendChild(th);
      const td = tr.insertCell(); td.className = "num"; td.textContent = value;
    }
    rows("failures", true, s.failures.map(f => [f.reason, f.count, f.example]));
    rows("classes", true, Object.entries(s.attempts_by_class));
    beat(s.heartbeat);
    const paused = document.getElementById("paused");
    paused.hidden = !s.paused;
    paused.textContent = s.paused ? `${s.paused}: new submissions are held (\`hpcrun resume\`).` : "";
    const outages = document.getElementById("outages");
    outages.hidden = !s.outages.length;
    outages.textContent = s.outages.join("; ");
    rows("audit", true, s.audit.map(e => [e.at, e.who, e.command, e.detail]));
    const pilots = document.getElementById("pilots-part");
    pilots.hidden = !s.pilots;
    if (s.pilots) {
      text("pilots-line", `${s.pilots.running} input(s) running in ${s.pilots.pilots.length} pilot(s), ` +
           `${s.pilots.waiting} waiting in the queue, ${s.pilots.done} done, ${s.pilots.fenced} pilot(s) ended`);
      rows("pilots", true, s.pilots.pilots.map(p => [p.pilot, p.node, p.state, `${p.inputs}/${p.slots}`, p.ends || ""]));
    }
    document.body.dataset.updated = s.generated_at;
  }
  async function refresh() {
    try {
      const r = await fetch("/api/summary.json", {cache: "no-store"});
      if (r.ok) show(await r.json());
    } catch (e) { /* the next refresh tries again */ }
    setTimeout(refresh, every);
  }
  refresh();
})();
