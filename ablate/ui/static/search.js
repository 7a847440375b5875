// ablate ui: a search's page (Optuna's trials) and the comparison of a few runs.
"use strict";

const PRUNED = "#ff7f0e", COMPLETE = "#1f77b4", BEST = "#2ca02c";

async function searchPage() {
  const name = document.body.dataset.search;
  let last = null;
  async function load() {
    try {
      const data = await get("/api/search?" + query({name}));
      const seen = JSON.stringify(data.trials);
      if (seen === last) { stamp(); return; }
      last = seen;
      const about = $("search-about"); about.textContent = data.direction + " · " + data.trials.length + " trials";
      if (data.sweep) {
        about.appendChild(document.createTextNode(" · runs and curves: "));
        about.appendChild(el("a", data.sweep, {href: "/sweep?" + query({name: data.sweep})}));
      }
      trialsTable(data);
      drawChart($("chart"), trialSeries(data), {logx: false, logy: false, xlabel: "trial", ylabel: "value", integerX: true});
      $("chart-note").textContent = "each trial is a point at its number; a pruned trial (hollow, orange) shows " +
        "the last value it reported before it was stopped, not a final one, and is left out of the best so far";
      slices(data);
      importances(data.importances);
      stamp();
    } catch (err) { fail(err); }
  }
  await load();
  setInterval(() => { if (!document.hidden) load(); }, POLL_MS * 2);
}

function trialsTable(data) {
  const keys = Object.keys(data.params);
  const cols = ["number", "state", "value", ...keys, "run", "started", "finished"];
  const head = document.querySelector("#trials thead"), body = document.querySelector("#trials tbody");
  head.textContent = ""; body.textContent = "";
  const tr = el("tr"); cols.forEach((c) => tr.appendChild(el("th", c))); head.appendChild(tr);
  for (const t of data.trials) {
    const row = el("tr", null, {"data-trial": t.number, class: "state-" + t.state.toLowerCase()});
    for (const c of cols) {
      const td = el("td");
      if (c === "run" && t.run !== null) td.appendChild(el("a", t.run, {href: "/run/" + t.run}));
      else td.textContent = fmt("", keys.includes(c) ? t.params[c] : c === "state" ? t.state.toLowerCase() : t[c]);
      row.appendChild(td);
    }
    body.appendChild(row);
  }
}

// completed trials as points, pruned ones as hollow points, and the best value so far as a line
function trialSeries(data) {
  const done = data.trials.filter((t) => t.state === "COMPLETE" && t.value !== null);
  const pruned = data.trials.filter((t) => t.state === "PRUNED" && t.value !== null);
  const better = data.direction === "maximize" ? Math.max : Math.min;
  let best = null;
  const bx = [], by = [];
  for (const t of done) { best = best === null ? t.value : better(best, t.value); bx.push(t.number); by.push(best); }
  const out = [];
  if (done.length) out.push({label: "completed", x: done.map((t) => t.number), mean: done.map((t) => t.value), low: null,
                             high: null, color: COMPLETE, points: true});
  if (pruned.length) out.push({label: "pruned (last reported value)", x: pruned.map((t) => t.number),
                               mean: pruned.map((t) => t.value), low: null, high: null, color: PRUNED, points: true,
                               fill: "#fff"});
  if (bx.length) out.push({label: "best so far", x: bx, mean: by, low: null, high: null, color: BEST, step: true});
  return out;
}

// the value against each parameter (completed trials; a categorical parameter's choices at 0, 1, ..., each tick
// labelled with its choice)
function slices(data) {
  const box = $("slices");
  box.textContent = "";
  const done = data.trials.filter((t) => t.state === "COMPLETE" && t.value !== null);
  for (const [p, kind] of Object.entries(data.params)) {
    const have = done.filter((t) => t.params[p] !== undefined);
    const at = (v) => kind.choices ? kind.choices.map(String).indexOf(String(v)) : Number(v);
    const order = have.map((t) => [at(t.params[p]), t.value]).sort((a, b) => a[0] - b[0]);
    const chart = el("div", null, {class: "slice", "data-param": p});
    box.appendChild(chart);
    const xlabel = p + (kind.choices ? " (" + kind.choices.join(", ") + ")" : kind.log ? " (log)" : "");
    drawChart(chart, [{label: p, x: order.map((o) => o[0]), mean: order.map((o) => o[1]), low: null, high: null,
                       color: COMPLETE, points: true}], {logx: Boolean(kind.log), logy: false, xlabel, ylabel: "value",
                                                         integerX: Boolean(kind.choices),
                                                         xticks: kind.choices ? kind.choices.map(String) : null});
  }
}

function importances(found) {
  const box = $("importances");
  box.textContent = "";
  if (!found || !Object.keys(found.values).length) { box.appendChild(el("p", found ? found.why : "", {class: "hint"})); return; }
  const table = el("table", null, {class: "grid"});
  for (const [p, v] of Object.entries(found.values)) {
    const tr = el("tr", null, {"data-param": p});
    tr.appendChild(el("th", p));
    const bar = el("span", null, {class: "bar"}); bar.style.width = Math.round(v * 200) + "px";
    const td = el("td"); td.appendChild(bar); td.appendChild(document.createTextNode(" " + fmt("", v)));
    tr.appendChild(td); table.appendChild(tr);
  }
  box.appendChild(table);
  box.appendChild(el("p", found.why, {class: "hint"}));
}

// ---------------------------------------------------------------- compare: a few runs side by side

async function comparePage() {
  const defaults = {runs: "", x: "steps", y: "eval", all: false, seeds: false};
  const view = readURL(defaults);
  $("x").value = view.x; $("y").value = view.y; $("all").checked = view.all; $("seeds").checked = view.seeds;
  async function load() {
    try {
      const data = await get("/api/compare?" + query({runs: view.runs, x: view.x, y: view.y, seeds: view.seeds}));
      fields(data);
      const opts = {logx: $("logx").checked, logy: $("logy").checked, xlabel: view.x, ylabel: view.y + " loss"};
      drawChart($("chart"), data.series, opts);
      drawChart($("diff"), data.differences.map((d, i) => ({...d, color: data.series[i + 1] ? data.series[i + 1].color : null})),
                {...opts, logy: false, ylabel: view.y + " loss difference"});
      stamp();
    } catch (err) { fail(err); }
  }
  function fields(data) {
    const table = $("fields"); table.textContent = "";
    const head = el("tr"); head.appendChild(el("th", "field"));
    data.runs.forEach((r, i) => {
      const th = el("th"); const chip = el("span", null, {class: "swatch"});
      chip.style.background = data.series[i] ? data.series[i].color : "#ccc";
      th.appendChild(chip); th.appendChild(el("a", "run " + r, {href: "/run/" + r})); head.appendChild(th);
    });
    table.appendChild(head);
    const shown = data.fields.filter((f) => view.all || f.differ);
    for (const f of shown) {
      const tr = el("tr", null, {class: f.differ ? "differ" : "", "data-field": f.field});
      tr.appendChild(el("th", f.field));
      f.values.forEach((v) => tr.appendChild(el("td", fmt(f.field, v))));
      table.appendChild(tr);
    }
    $("fields-note").textContent = data.fields.filter((f) => f.differ).length + " of " + data.fields.length +
      " fields differ (highlighted)" + (view.all ? "" : "; the equal ones are hidden");
  }
  for (const id of ["x", "y", "all", "seeds", "logx", "logy"]) {
    $(id).addEventListener("change", () => {
      if (id in view) view[id] = $(id).type === "checkbox" ? $(id).checked : $(id).value;
      writeURL(view, defaults, {});
      load();
    });
  }
  await load();
}
