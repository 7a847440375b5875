// ablate ui: the pages draw themselves from the JSON endpoints. Every value from the database is written with
// textContent (never innerHTML), so a name or an error text can only ever be text.
"use strict";

const POLL_MS = 3000;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const $ = (id) => document.getElementById(id);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

async function get(url) {
  const response = await fetch(url, {credentials: "same-origin"});
  const body = await response.json().catch(() => ({error: response.statusText}));
  if (!response.ok) throw new Error(body.error || response.statusText);
  $("error").hidden = true;
  return body;
}

function fail(err) {
  $("error").textContent = String(err.message || err);
  $("error").hidden = false;
}

function stamp() {
  $("live").textContent = "live · read " + new Date().toLocaleTimeString();
}

function fmt(key, v) {
  if (v === null || v === undefined) return "";
  if (key === "progress") return Math.round(v * 100) + "%";
  if (typeof v === "number" && (key === "train" || key === "eval")) return v.toFixed(3);
  if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(4)));
  return String(v);
}

function query(params) {
  return Object.entries(params).map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v)).join("&");
}

// ---------------------------------------------------------------- charts (uPlot, vendored)

function drawChart(box, series, opts) {
  if (box._plot) { box._plot.destroy(); box._plot = null; }
  box.textContent = "";
  const keep = (x, y) => (!opts.logx || x > 0) && (!opts.logy || y > 0);
  const tables = [], specs = [], bands = [];
  let points = 0, xmax = null;
  series.forEach((s, i) => {
    const xs = [], cols = [[], [], []];
    s.x.forEach((x, j) => {
      if (!keep(x, s.mean[j])) return;
      xs.push(x); cols[0].push(s.mean[j]);
      cols[1].push(s.low ? s.low[j] : null); cols[2].push(s.high ? s.high[j] : null);
    });
    if (!xs.length) return;
    points += xs.length;
    xmax = Math.max(xmax === null ? -Infinity : xmax, xs[xs.length - 1]);
    const color = PALETTE[tables.length % PALETTE.length];
    const base = 1 + specs.length;
    if (s.low) {
      tables.push([xs, cols[0], cols[1], cols[2]]);
      specs.push({label: s.label, stroke: color, width: 1.5, spanGaps: true},
                 {label: s.label + " min", stroke: color + "55", width: 0.5, spanGaps: true},
                 {label: s.label + " max", stroke: color + "55", width: 0.5, spanGaps: true});
      bands.push({series: [base + 2, base + 1], fill: color + "33"});
    } else {
      tables.push([xs, cols[0]]);
      specs.push({label: s.label, stroke: color, width: 1.5, spanGaps: true});
    }
  });
  box.dataset.points = String(points);
  box.dataset.series = String(tables.length);
  box.dataset.xmax = xmax === null ? "" : String(xmax);
  if (!tables.length) { box.appendChild(el("p", "no points yet", {class: "hint"})); return; }
  const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
  const plot = new uPlot({
    width: Math.max(480, box.clientWidth || 900), height: 360,
    scales: {x: {time: false, distr: opts.logx ? 3 : 1}, y: {distr: opts.logy ? 3 : 1}},
    axes: [{label: opts.xlabel}, {label: opts.ylabel}],
    legend: {live: false},
    series: [{label: opts.xlabel}, ...specs], bands: bands,
  }, data, box);
  // a band's edges draw the band; only its mean has a row in the legend
  plot.root.querySelectorAll(".u-legend tr.u-series").forEach((row) => {
    if (/ (min|max)$/.test(row.textContent.trim())) row.style.display = "none";
  });
  box._plot = plot;
}

function chartOptions() {
  return {logx: $("logx").checked, logy: $("logy").checked, xlabel: $("x").value,
          ylabel: ($("y") ? $("y").value : "") + " loss"};
}

// ---------------------------------------------------------------- the sweeps page

async function sweepsPage() {
  const body = document.querySelector("#sweeps tbody");
  async function load() {
    try {
      const data = await get("/api/sweeps");
      body.textContent = "";
      for (const s of data.sweeps) {
        const tr = el("tr");
        const link = el("a", s.name, {href: "/sweep?" + query({name: s.name})});
        const name = el("td"); name.appendChild(link);
        if (s.description) name.appendChild(el("div", s.description, {class: "hint"}));
        tr.appendChild(name);
        tr.appendChild(el("td", s.runs, {class: "num"}));
        tr.appendChild(el("td", Object.entries(s.counts).map(([k, n]) => n + " " + k).join(", ")));
        for (const k of ["budget", "hardware", "recipe", "created"]) tr.appendChild(el("td", s[k]));
        body.appendChild(tr);
      }
      if (!data.sweeps.length) body.appendChild(el("tr")).appendChild(el("td", "no sweeps yet", {colspan: 7}));
      const found = document.querySelector("#searches tbody");
      found.textContent = "";
      for (const s of data.searches) {
        const tr = el("tr");
        const name = el("td"); name.appendChild(el("a", s.name, {href: "/search?" + query({name: s.name})}));
        tr.appendChild(name);
        tr.appendChild(el("td", s.direction));
        tr.appendChild(el("td", s.trials, {class: "num"}));
        tr.appendChild(el("td", Object.entries(s.counts).map(([k, n]) => n + " " + k.toLowerCase()).join(", ")));
        tr.appendChild(el("td", s.best ? "trial " + s.best.number + ": " + fmt("", s.best.value) + " at " +
          Object.entries(s.best.params).map(([k, v]) => k + "=" + fmt("", v)).join(" ") : ""));
        found.appendChild(tr);
      }
      if (!data.searches.length) found.appendChild(el("tr")).appendChild(el("td", "no searches in this DB", {colspan: 5}));
      stamp();
    } catch (err) { fail(err); }
  }
  await load();
  setInterval(load, POLL_MS * 2);
}

// ---------------------------------------------------------------- a sweep's page

async function sweepPage() {
  const sweep = document.body.dataset.sweep;
  const state = {filter: "", sort: "", offset: 0, limit: 50, token: null};

  async function loadRuns() {
    const data = await get("/api/runs?" + query({sweep, filter: state.filter, sort: state.sort, offset: state.offset,
                                                 limit: state.limit}));
    const head = document.querySelector("#runs thead"), body = document.querySelector("#runs tbody");
    head.textContent = ""; body.textContent = "";
    const tr = el("tr");
    for (const c of data.columns) {
      const mark = state.sort === c ? " ▲" : state.sort === "-" + c ? " ▼" : "";
      const th = el("th", c + mark, {"data-column": c, title: "sort by " + c});
      th.addEventListener("click", () => {
        state.sort = state.sort === c ? "-" + c : c; state.offset = 0; refresh(true);
      });
      tr.appendChild(th);
    }
    head.appendChild(tr);
    for (const r of data.rows) {
      const row = el("tr", null, {"data-run": r.run, class: "status-" + r.status});
      for (const c of data.columns) {
        const td = el("td", null, {class: typeof r[c] === "number" ? "num" : ""});
        if (c === "run") td.appendChild(el("a", r.run, {href: "/run/" + r.run}));
        else td.textContent = fmt(c, r[c]);
        row.appendChild(td);
      }
      body.appendChild(row);
    }
    const last = Math.min(data.offset + data.limit, data.matched);
    $("matched").textContent = (data.matched ? (data.offset + 1) + "–" + last : "0") + " of " +
      data.matched.toLocaleString() + " matching (" + data.total.toLocaleString() + " runs)";
    $("prev").disabled = data.offset === 0;
    $("next").disabled = last >= data.matched;
    $("counts").textContent = Object.entries(data.counts).map(([k, n]) => n.toLocaleString() + " " + k).join(", ");
    state.token = data.token;
  }

  async function loadCurves() {
    const data = await get("/api/curves?" + query({sweep, filter: state.filter, sort: state.sort, x: $("x").value,
                                                   y: $("y").value, group: $("group").value}));
    drawChart($("chart"), data.series, chartOptions());
    $("chart-note").textContent = data.note;
  }

  async function loadStudy() {
    const data = await get("/api/study?" + query({sweep}));
    const box = $("study");
    box.textContent = "";
    for (const t of data.tables) {
      box.appendChild(el("h3", t.title));
      const table = el("table", null, {class: "grid study"});
      const head = el("tr"); head.appendChild(el("th", ""));
      for (const c of t.columns) head.appendChild(el("th", c));
      table.appendChild(head);
      for (const r of t.rows) {
        const tr = el("tr");
        r.forEach((cell, i) => tr.appendChild(el(i ? "td" : "th", cell)));
        table.appendChild(tr);
      }
      box.appendChild(table);
      for (const n of t.notes) box.appendChild(el("p", n, {class: "hint"}));
    }
    const claims = data.claims;
    if (claims) {
      box.appendChild(el("h3", "Claims against the study"));
      for (const line of claims.statements) box.appendChild(el("p", line, {class: "claim"}));
      box.appendChild(verdictTable(claims.head, claims.rows, 7, "grid study verdicts"));
      box.appendChild(el("p", "Method: " + claims.method + ".", {class: "hint"}));
      if (claims.floor) box.appendChild(el("p", claims.floor, {class: "hint"}));
    }
    const race = data.race;  // an adaptive sweep: each claim's rounds, the statistic against its boundary
    if (race) {
      box.appendChild(el("h3", "The race (adaptive seeds)"));
      box.appendChild(verdictTable(race.head, race.rows, 5, "grid study race"));
      box.appendChild(el("p", race.spent + ".", {class: "hint"}));
      box.appendChild(el("p", "Method: " + race.method + ".", {class: "hint"}));
    }
    box.appendChild(el("p", "read " + data.read_at + " (again when runs finish, at most every 30 s)", {class: "hint"}));
    if (!data.tables.length && !claims) box.appendChild(el("p", "no comparison tables in this sweep's report block", {class: "hint"}));
  }

  // a table of rows whose column `at` is a verdict, coloured by it (the claims table, the race table)
  function verdictTable(columns, rows, at, cls) {
    const table = el("table", null, {class: cls});
    const head = el("tr");
    for (const c of columns) head.appendChild(el("th", c));
    table.appendChild(head);
    for (const r of rows) {
      const tr = el("tr");
      r.forEach((cell, i) => tr.appendChild(el("td", cell, i === at ? {class: "verdict " + cell.split(" (")[0].replace(/ /g, "-")} : undefined)));
      table.appendChild(tr);
    }
    return table;
  }

  async function refresh(all) {
    try {
      await loadRuns();
      await loadCurves();
      if (all) await loadStudy();
      stamp();
    } catch (err) { fail(err); }
  }

  let timer = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.filter = $("filter").value; state.offset = 0; refresh(false); }, 300);
  });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadRuns().catch(fail); });
  $("next").addEventListener("click", () => { state.offset += state.limit; loadRuns().catch(fail); });
  for (const id of ["x", "y", "logx", "logy"]) $(id).addEventListener("change", () => loadCurves().catch(fail));
  $("group").addEventListener("change", () => loadCurves().catch(fail));
  $("chart-controls").addEventListener("submit", (e) => { e.preventDefault(); loadCurves().catch(fail); });
  $("table-controls").addEventListener("submit", (e) => e.preventDefault());

  await refresh(true);
  let finished = (await get("/api/token?" + query({sweep}))).finished;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const now = await get("/api/token?" + query({sweep}));
      if (now.token !== state.token) await refresh(now.finished !== finished); else stamp();
      finished = now.finished;
    } catch (err) { fail(err); }
  }, POLL_MS);
}

// ---------------------------------------------------------------- a run's page

async function runPage() {
  const run = document.body.dataset.run;
  let last = null;
  async function load() {
    try {
      const data = await get("/api/run/" + run);
      const seen = JSON.stringify([data.fields.status, data.fields.last_step, data.fields.last_eval_loss]);
      if (seen === last) { stamp(); return data.fields.status; }
      last = seen;
      const sweep = $("run-sweep"); sweep.textContent = "of ";
      sweep.appendChild(el("a", data.sweep, {href: "/sweep?" + query({name: data.sweep})}));
      $("run-error").textContent = data.error || "none";
      const body = document.querySelector("#fields tbody"); body.textContent = "";
      for (const [k, v] of Object.entries(data.fields)) {
        if (v === null || v === undefined) continue;
        const tr = el("tr"); tr.appendChild(el("th", k)); tr.appendChild(el("td", fmt(k, v))); body.appendChild(tr);
      }
      $("config").textContent = JSON.stringify(data.config, null, 2);
      $("log").textContent = data.log || "(no log on this host)";
      $("log-path").textContent = data.log_path;
      await curves();
      stamp();
      return data.fields.status;
    } catch (err) { fail(err); }
  }
  async function curves() {
    const data = await get("/api/run/" + run + "/curves?" + query({x: $("x").value}));
    const series = [...data.train.map((s) => ({...s, label: "train"})), ...data.eval.map((s) => ({...s, label: "eval"}))];
    drawChart($("chart"), series, {...chartOptions(), ylabel: "loss"});
  }
  for (const id of ["x", "logx", "logy"]) $(id).addEventListener("change", () => curves().catch(fail));
  $("sample-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    $("sample-out").textContent = "loading the checkpoint and completing…";
    try {
      const data = await get("/api/run/" + run + "/sample?" + query({prompt: $("prompt").value, tokens: $("tokens").value}));
      $("sample-out").textContent = data.prompt + data.completion;
    } catch (err) { $("sample-out").textContent = String(err.message || err); }
  });
  await load();
  setInterval(() => { if (!document.hidden) load(); }, POLL_MS);
}

// ---------------------------------------------------------------- a search's page (Optuna's trials)

async function searchPage() {
  const name = document.body.dataset.search;
  async function load() {
    try {
      const data = await get("/api/search?" + query({name}));
      const about = $("search-about"); about.textContent = data.direction + " · " + data.trials.length + " trials";
      if (data.sweep) {
        about.appendChild(document.createTextNode(" · runs and curves: "));
        about.appendChild(el("a", data.sweep, {href: "/sweep?" + query({name: data.sweep})}));
      }
      const keys = [...new Set(data.trials.flatMap((t) => Object.keys(t.params)))];
      const cols = ["number", "state", "value", ...keys, "run", "started", "finished"];
      const head = document.querySelector("#trials thead"), body = document.querySelector("#trials tbody");
      head.textContent = ""; body.textContent = "";
      const tr = el("tr"); cols.forEach((c) => tr.appendChild(el("th", c))); head.appendChild(tr);
      for (const t of data.trials) {
        const row = el("tr", null, {"data-trial": t.number});
        for (const c of cols) {
          const td = el("td");
          if (c === "run" && t.run !== null) td.appendChild(el("a", t.run, {href: "/run/" + t.run}));
          else td.textContent = fmt("", keys.includes(c) ? t.params[c] : c === "state" ? t.state.toLowerCase() : t[c]);
          row.appendChild(td);
        }
        body.appendChild(row);
      }
      const done = data.trials.filter((t) => t.value !== null);
      drawChart($("chart"), [{label: "value by trial", x: done.map((t) => t.number), mean: done.map((t) => t.value),
                               low: null, high: null}], {logx: false, logy: false, xlabel: "trial", ylabel: "value"});
      stamp();
    } catch (err) { fail(err); }
  }
  await load();
  setInterval(() => { if (!document.hidden) load(); }, POLL_MS * 2);
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "sweeps") sweepsPage();
  else if (page === "sweep") sweepPage();
  else if (page === "run") runPage();
  else if (page === "search") searchPage();
});
