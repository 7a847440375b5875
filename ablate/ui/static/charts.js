// ablate ui: charts (uPlot, vendored). A curve keeps the colour and dash the server gave its configuration; a chart
// can be split into small multiples (one panel per value of a facet axis, one y scale for all); hovering a curve
// highlights it and reads out its values; a chart downloads as PNG (its canvases) or SVG (the server draws it).
"use strict";

const FALLBACK = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

// series: [{label, x, mean, low, high, color, dash, facet, points (markers only), step (a stepped line)}];
// opts: {logx, logy, xlabel, ylabel, facet, integerX (whole numbers on x: trials, choices)}
function drawChart(box, series, opts) {
  for (const p of box._plots || []) p.destroy();
  box._plots = [];
  box.textContent = "";
  const keep = (x, y) => Number.isFinite(x) && (!opts.logx || x > 0) && (!opts.logy || y > 0);
  const facets = opts.facet ? [...new Set(series.map((s) => String(s.facet)))] : [null];
  const yrange = sharedRange(series, keep, opts.logy);
  let points = 0, xmax = null, drawn = 0;
  const colors = {};
  box.classList.toggle("faceted", facets.length > 1);
  for (const value of facets) {
    const mine = series.filter((s) => value === null || String(s.facet) === value);
    const panel = el("div", null, {class: "panel"});
    if (value !== null) { panel.dataset.facet = value; panel.appendChild(el("div", opts.facet + " = " + value, {class: "panel-title"})); }
    box.appendChild(panel);
    const built = uplotData(mine, keep);
    points += built.points; drawn += built.count;
    if (built.xmax !== null) xmax = Math.max(xmax === null ? -Infinity : xmax, built.xmax);
    Object.assign(colors, built.colors);
    if (!built.count) { panel.appendChild(el("p", "no points yet", {class: "hint"})); continue; }
    const width = facets.length > 1 ? Math.max(320, Math.floor((box.clientWidth || 900) / Math.min(3, facets.length)) - 12)
                                    : Math.max(480, box.clientWidth || 900);
    panel.appendChild(el("div", null, {class: "readout"}));
    box._plots.push(plotOne(panel, built, opts, width, facets.length > 1 ? 260 : 360, yrange));
  }
  box.dataset.points = String(points);
  box.dataset.series = String(drawn);
  box.dataset.panels = String(facets.length);
  box.dataset.colors = JSON.stringify(colors);
  box.dataset.xmax = xmax === null ? "" : String(xmax);
  if (!drawn && facets.length === 1) { box.textContent = ""; box.appendChild(el("p", "no points yet", {class: "hint"})); }
}

function sharedRange(series, keep, logy) {
  let lo = Infinity, hi = -Infinity;
  for (const s of series) {
    s.x.forEach((x, j) => {
      for (const y of [s.mean[j], s.low ? s.low[j] : null, s.high ? s.high[j] : null]) {
        if (y === null || !Number.isFinite(y) || !keep(x, y)) continue;
        lo = Math.min(lo, y); hi = Math.max(hi, y);
      }
    });
  }
  if (!Number.isFinite(lo)) return null;
  if (logy) return [lo / 1.05, hi * 1.05];
  if (hi - lo < 1e-6 * Math.max(1, Math.abs(hi))) return [lo - 0.05, hi + 0.05];  // a flat line (a constant difference)
  const pad = (hi - lo) * 0.04;
  return [lo - pad, hi + pad];
}

// one uPlot table per curve (joined on x), its mean and, for a band, its min and max as hidden edges
function uplotData(series, keep) {
  const tables = [], specs = [], bands = [], colors = {};
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
    const color = s.color || FALLBACK[i % FALLBACK.length];
    colors[s.label] = color;
    const line = {label: s.label, stroke: color, width: s.points ? 0 : 1.6, dash: s.dash || [], spanGaps: true,
                  points: s.points ? {show: true, size: 7, stroke: color, fill: s.fill || color} : {show: false}};
    if (s.points) line.paths = () => null;
    if (s.step) line.paths = uPlot.paths.stepped({align: 1});
    const base = 1 + specs.length;
    if (s.low) {
      tables.push([xs, cols[0], cols[1], cols[2]]);
      specs.push(line, {label: s.label + " min", stroke: color + "55", width: 0.5, spanGaps: true, points: {show: false}},
                 {label: s.label + " max", stroke: color + "55", width: 0.5, spanGaps: true, points: {show: false}});
      bands.push({series: [base + 2, base + 1], fill: color + "2e"});
    } else {
      tables.push([xs, cols[0]]);
      specs.push(line);
    }
  });
  const data = !tables.length ? null : tables.length === 1 ? tables[0] : uPlot.join(tables);
  return {data, specs, bands, colors, points, xmax, count: tables.length};
}

function plotOne(panel, built, opts, width, height, yrange) {
  const readout = panel.querySelector(".readout");
  let focused = null;
  const show = (u) => {  // the highlighted curve's values at the cursor
    const i = u.cursor.idx;
    if (focused === null || i === null || i === undefined) { readout.textContent = ""; return; }
    const s = u.series[focused], y = u.data[focused][i];
    readout.textContent = s.label + " · " + opts.xlabel + " " + fmt("", u.data[0][i]) + " · " +
      (y === null || y === undefined ? "no point here" : opts.ylabel + " " + fmt("", y));
    readout.style.borderColor = s._stroke || "#888";
  };
  const plot = new uPlot({
    width, height,
    scales: {x: {time: false, distr: opts.logx ? 3 : 1, range: opts.integerX ? (u, lo, hi) => [lo - 0.5, hi + 0.5] : undefined},
             y: {distr: opts.logy ? 3 : 1, range: yrange ? () => yrange : undefined}},
    axes: [opts.xticks ? {label: opts.xlabel, incrs: [1], values: (u, splits) => splits.map((v) => opts.xticks[v] ?? "")}
           : opts.integerX ? {label: opts.xlabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]} : {label: opts.xlabel},
           {label: opts.ylabel}],
    legend: {show: false},
    focus: {alpha: 0.2},
    cursor: {focus: {prox: 24, dist: (u, i, j, at, pointer) => edge(u, i) ? Infinity : at - pointer},
             points: {show: false}},
    series: [{label: opts.xlabel}, ...built.specs], bands: built.bands,
    hooks: {
      setSeries: [(u, i, o) => {
        if (!o || o.focus === undefined) return;
        focused = i !== null && !edge(u, i) ? i : null;
        panel.dataset.focused = focused === null ? "" : u.series[focused].label;
        show(u);
      }],
      setCursor: [show],
    },
  }, built.data, panel);
  return plot;
}

const edge = (u, i) => / (min|max)$/.test(u.series[i].label);  // a band's edge: drawn, never highlighted

// the legend: which axis the colour says, which the dash, which the shade (not one line per curve)
function drawLegend(box, legend) {
  box.textContent = "";
  if (!legend) return;
  if (legend.color) {
    const row = el("span", null, {class: "key"});
    row.appendChild(el("b", "colour: " + legend.color + " "));
    for (const [v, c] of Object.entries(legend.colors)) {
      const item = el("span", null, {class: "key-item", "data-value": v});
      const chip = el("span", null, {class: "swatch"}); chip.style.background = c;
      item.appendChild(chip); item.appendChild(document.createTextNode(v)); row.appendChild(item);
    }
    box.appendChild(row);
  }
  if (legend.dash) {
    const row = el("span", null, {class: "key"});
    row.appendChild(el("b", "dash: " + legend.dash + " "));
    for (const [v, d] of Object.entries(legend.dashes)) {
      const item = el("span", null, {class: "key-item"});
      item.appendChild(dashSample(d)); item.appendChild(document.createTextNode(v)); row.appendChild(item);
    }
    box.appendChild(row);
  }
  if (legend.shade && legend.shade.length)
    box.appendChild(el("span", "shade: " + legend.shade.join(", ") + " (darker = first in the table's order)", {class: "key"}));
}

function dashSample(dash, color) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "28"); svg.setAttribute("height", "8");
  const line = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({x1: 0, y1: 4, x2: 28, y2: 4, stroke: color || "#333", "stroke-width": 2.5})) line.setAttribute(k, v);
  if (dash.length) line.setAttribute("stroke-dasharray", dash.join(" "));
  svg.appendChild(line);
  return svg;
}

// the chart's panels as one canvas (each panel's canvas where the page draws it, with its title)
function chartCanvas(box) {
  const panels = [...box.querySelectorAll(".panel")].filter((p) => p.querySelector("canvas"));
  if (!panels.length) return null;
  const top = box.getBoundingClientRect();
  const out = document.createElement("canvas");
  const ratio = window.devicePixelRatio || 1;
  out.width = Math.ceil(box.scrollWidth * ratio); out.height = Math.ceil(box.scrollHeight * ratio);
  const ctx = out.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, out.width, out.height);
  ctx.scale(ratio, ratio);
  for (const p of panels) {
    const c = p.querySelector("canvas"), r = c.getBoundingClientRect();
    ctx.drawImage(c, r.left - top.left, r.top - top.top, r.width, r.height);
    const title = p.querySelector(".panel-title");
    if (title) { ctx.fillStyle = "#222"; ctx.font = "12px sans-serif"; ctx.fillText(title.textContent, r.left - top.left + 40, r.top - top.top - 4); }
  }
  return out;
}

function chartPNG(box, name) {
  const canvas = chartCanvas(box);
  if (canvas) download(canvas.toDataURL("image/png"), name + ".png");
}
