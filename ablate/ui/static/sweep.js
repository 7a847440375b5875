// ablate ui: a sweep's page. Its state (filter, sort, page, chart axes, grouping, facet, colour and dash axes, the
// selected runs, the chosen columns) lives in the URL, so a link reproduces the view. A filter that fails keeps its
// error beside it and an empty table until that filter succeeds (a poll never hides it).
"use strict";

const SWEEP_VIEW = {filter: "", sort: "", offset: 0, x: "steps", y: "eval", group: "seeds", facet: "", color: "",
                    dash: "", logx: false, logy: false, runs: "", columns: ""};

async function sweepPage() {
  const sweep = document.body.dataset.sweep;
  const state = {...readURL(SWEEP_VIEW), limit: 50, token: null, filterError: null};
  const selected = () => new Set(state.runs ? state.runs.split(",").map(Number) : []);
  const save = () => writeURL(state, SWEEP_VIEW, {name: sweep});
  for (const k of ["filter", "x", "y", "group"]) $(k).value = state[k];
  $("logx").checked = state.logx; $("logy").checked = state.logy;

  function tableQuery(extra) {
    return query({sweep, filter: state.filter, sort: state.sort, columns: state.columns, ...extra});
  }

  async function loadRuns() {
    let data;
    try {
      data = await get("/api/runs?" + tableQuery({offset: state.offset, limit: state.limit}));
    } catch (err) {
      state.filterError = String(err.message || err);
      showFilterError();
      throw err;
    }
    state.filterError = null;
    showFilterError();
    drawRuns(data);
    state.token = data.token;
  }

  // the filter's error stays beside it, the table empty, until that filter succeeds
  function showFilterError() {
    $("filter-error").textContent = state.filterError || "";
    $("filter-error").hidden = !state.filterError;
    if (!state.filterError) return;
    document.querySelector("#runs tbody").textContent = "";
    $("matched").textContent = "no rows: the filter has an error";
    $("error").hidden = true;
  }

  function drawRuns(data) {
    const head = document.querySelector("#runs thead"), body = document.querySelector("#runs tbody");
    head.textContent = ""; body.textContent = "";
    const tr = el("tr");
    tr.appendChild(el("th", "", {title: "select runs: the chart draws only them, compare sets them side by side"}));
    for (const c of data.columns) {
      const mark = state.sort === c ? " ▲" : state.sort === "-" + c ? " ▼" : "";
      const th = el("th", c + mark, {"data-column": c, title: "sort by " + c});
      th.addEventListener("click", () => {
        state.sort = state.sort === c ? "-" + c : c; state.offset = 0; refresh(true);
      });
      tr.appendChild(th);
    }
    head.appendChild(tr);
    const chosen = selected();
    for (const r of data.rows) {
      const row = el("tr", null, {"data-run": r.run, class: "status-" + r.status});
      const pick = el("input", null, {type: "checkbox", class: "pick", "data-run": r.run});
      pick.checked = chosen.has(r.run);
      pick.addEventListener("change", () => toggle(r.run, pick.checked));
      row.appendChild(el("td")).appendChild(pick);
      for (const c of data.columns) {
        const td = el("td", null, {class: c === "run" ? "run-cell" : typeof r[c] === "number" ? "num" : ""});
        if (c === "run") {
          const chip = el("span", null, {class: "line-chip", "data-color": r._color, title: "its curve's colour and dash"});
          chip.appendChild(dashSample(r._dash, r._color));
          td.appendChild(chip); td.appendChild(el("a", r.run, {href: "/run/" + r.run}));
        } else td.textContent = fmt(c, r[c]);
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
    $("hosts").textContent = (data.hosts || []).join("; ");  // drained hosts of the sweep's pool (flows/health.py)
    drawColumnChooser(data);
  }

  function drawColumnChooser(data) {
    const box = $("column-list");
    box.textContent = "";
    for (const c of data.available) {
      const label = el("label");
      const box1 = el("input", null, {type: "checkbox", value: c});
      box1.checked = data.columns.includes(c);
      box1.disabled = c === "run";
      box1.addEventListener("change", () => {
        state.columns = [...box.querySelectorAll("input:checked")].map((i) => i.value).join(",");
        save(); loadRuns().catch(fail);
      });
      label.appendChild(box1); label.appendChild(document.createTextNode(" " + c));
      box.appendChild(label);
    }
  }

  function toggle(run, on) {
    const chosen = selected();
    if (on) chosen.add(run); else chosen.delete(run);
    state.runs = [...chosen].join(",");
    save(); showSelection(); loadCurves().catch(fail);
  }

  function showSelection() {
    const n = selected().size;
    $("selection").hidden = !n;
    $("selection-text").textContent = n + " run" + (n === 1 ? "" : "s") + " selected: the chart draws only " +
      (n === 1 ? "it" : "them");
    $("compare").hidden = n < 2;
    $("compare").href = "/compare?" + query({runs: state.runs});
    $("compare-configs").hidden = n < 2;
    $("compare-configs").href = "/compare?" + query({runs: state.runs, seeds: 1});
  }

  function curveQuery() {
    return query({sweep, filter: state.filter, sort: state.sort, x: state.x, y: state.y, group: state.group,
                  runs: state.runs, facet: state.facet, color: state.color, dash: state.dash});
  }

  async function loadCurves() {
    if (state.filterError && !state.runs) { drawChart($("chart"), [], chartOptions()); return; }
    const data = await get("/api/curves?" + curveQuery());
    fillAxes(data.axes);
    drawChart($("chart"), data.series, {...chartOptions(), facet: state.facet});
    drawLegend($("chart-legend"), data.legend);
    $("chart-note").textContent = data.note;
  }

  function fillAxes(axes) {  // the facet, colour and dash choices: the axes that vary
    for (const id of ["facet", "color", "dash"]) {
      const box = $(id);
      const want = [id === "facet" ? "none" : "auto", ...axes.filter((a) => id === "facet" || a !== "seed")];
      if (box.options.length === want.length && [...box.options].every((o, i) => o.textContent === want[i])) continue;
      box.textContent = "";
      want.forEach((a, i) => box.appendChild(el("option", a, {value: i ? a : ""})));
      box.value = state[id];
    }
  }

  async function refresh(all) {
    try {
      await loadRuns();
    } catch (err) {
      if (!state.filterError) fail(err);
    }
    try {
      await loadCurves();
      if (all) await loadStudy(sweep);
      stamp();
    } catch (err) { fail(err); }
  }

  let timer = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.filter = $("filter").value; state.offset = 0; save(); refresh(false); }, 300);
  });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); save(); loadRuns().catch(fail); });
  $("next").addEventListener("click", () => { state.offset += state.limit; save(); loadRuns().catch(fail); });
  for (const id of ["x", "y", "group", "facet", "color", "dash", "logx", "logy"]) {
    $(id).addEventListener("change", () => {
      state[id] = $(id).type === "checkbox" ? $(id).checked : $(id).value;
      save(); loadCurves().catch(fail);
    });
  }
  $("clear-selection").addEventListener("click", () => {
    state.runs = ""; save(); showSelection(); loadRuns().catch(fail); loadCurves().catch(fail);
  });
  $("png").addEventListener("click", () => chartPNG($("chart"), sweep + "-" + state.y + "-by-" + state.x));
  $("svg").addEventListener("click", () => download("/api/curves.svg?" + curveQuery() + "&" +
                                                    query({logx: state.logx, logy: state.logy}), ""));
  $("csv").addEventListener("click", () => download("/api/runs.csv?" + tableQuery({}), ""));
  $("chart-controls").addEventListener("submit", (e) => { e.preventDefault(); loadCurves().catch(fail); });
  $("table-controls").addEventListener("submit", (e) => e.preventDefault());

  showSelection();
  await refresh(true);
  let finished = (await get("/api/token?" + query({sweep}))).finished;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const now = await get("/api/token?" + query({sweep}));
      if (now.token !== state.token || state.filterError) await refresh(now.finished !== finished); else stamp();
      finished = now.finished;
    } catch (err) { fail(err); }
  }, POLL_MS);
}

// ---------------------------------------------------------------- the study: comparison tables, claims, the race

async function loadStudy(sweep) {
  const data = await get("/api/study?" + query({sweep}));
  const box = $("study");
  box.textContent = "";
  const said = data.answer || [];  // each claim's verdict as a sentence, at the top of the page
  $("answer").textContent = "";
  for (const line of said) $("answer").appendChild(el("li", line));
  $("answer-section").hidden = !said.length;
  const claims = data.claims;  // the claims first: what the sweep was run to tell
  if (claims) {
    box.appendChild(el("h3", "Claims against the study"));
    box.appendChild(verdictTable(claims.head, claims.rows, claims.head.indexOf("verdict"), "grid study verdicts"));
    for (const line of claims.statements) box.appendChild(el("p", line, {class: "claim hint"}));
    box.appendChild(el("p", "Method: " + claims.method + ".", {class: "hint"}));
    if (claims.floor) box.appendChild(el("p", claims.floor, {class: "hint"}));
  }
  for (const t of data.tables) {
    box.appendChild(el("h3", t.title));
    const table = el("table", null, {class: "grid study"});
    const head = el("tr"); head.appendChild(el("th", ""));
    for (const c of t.columns) head.appendChild(el("th", c));
    table.appendChild(head);
    for (const r of t.rows) {
      const tr = el("tr");
      r.forEach((cell, i) => tr.appendChild(el(i ? "td" : "th", cell)));
      if (/published/.test(r[0])) tr.classList.add("published");  // the study's numbers, under ours
      table.appendChild(tr);
    }
    box.appendChild(table);
    for (const n of t.notes) box.appendChild(el("p", n, {class: "hint"}));
  }
  const race = data.race;  // an adaptive sweep: each claim's rounds, the statistic against its boundary
  if (race) {
    box.appendChild(el("h3", "The race (adaptive seeds)"));
    box.appendChild(verdictTable(race.head, race.rows, race.head.indexOf("decision"), "grid study race"));
    box.appendChild(el("p", race.spent + ".", {class: "hint"}));
    box.appendChild(el("p", "Method: " + race.method + ".", {class: "hint"}));
  }
  box.appendChild(el("p", "read " + data.read_at + " (again when runs finish, at most every 30 s)", {class: "hint"}));
  if (!data.tables.length && !claims) box.appendChild(el("p", "no comparison tables in this sweep's report block", {class: "hint"}));
}

// a table of rows whose column `at` is a verdict, drawn as a badge coloured by it (the claims table, the race)
function verdictTable(columns, rows, at, cls) {
  const table = el("table", null, {class: cls});
  const head = el("tr");
  for (const c of columns) head.appendChild(el("th", c));
  table.appendChild(head);
  for (const r of rows) {
    const tr = el("tr");
    r.forEach((cell, i) => {
      const td = el("td", i === at ? null : cell);
      if (i === at) td.appendChild(el("span", cell, {class: "badge verdict " + cell.split(" (")[0].replace(/ /g, "-")}));
      tr.appendChild(td);
    });
    table.appendChild(tr);
  }
  return table;
}
