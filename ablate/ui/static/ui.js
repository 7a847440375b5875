// ablate ui: the pages draw themselves from the JSON endpoints. Every value from the database is written with
// textContent (never innerHTML), so a name or an error text can only ever be text.
"use strict";

const POLL_MS = 3000;
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

// a page's state in its URL (a link reproduces the view): `defaults` names the keys; a value equal to its default
// is left out of the URL
function readURL(defaults) {
  const p = new URLSearchParams(location.search), out = {...defaults};
  for (const [k, d] of Object.entries(defaults)) {
    if (!p.has(k)) continue;
    out[k] = typeof d === "boolean" ? p.get(k) === "1" : typeof d === "number" ? Number(p.get(k)) || 0 : p.get(k);
  }
  return out;
}

function writeURL(state, defaults, fixed) {
  const p = new URLSearchParams(fixed);
  for (const [k, d] of Object.entries(defaults)) {
    if (state[k] === d) continue;
    p.set(k, typeof d === "boolean" ? (state[k] ? "1" : "0") : String(state[k]));
  }
  history.replaceState(null, "", location.pathname + "?" + p.toString());
}

function chartOptions() {
  return {logx: $("logx").checked, logy: $("logy").checked, xlabel: $("x").value,
          ylabel: ($("y") ? $("y").value : "") + " loss"};
}

function download(href, name) {
  const link = el("a", null, {href, download: name});
  document.body.appendChild(link); link.click(); link.remove();
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
    // the key: which colour is the train loss, which the eval loss
    drawLegend($("chart-legend"), {color: "split", colors: JSON.parse($("chart").dataset.colors || "{}")});
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

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "sweeps") sweepsPage();
  else if (page === "sweep") sweepPage();
  else if (page === "run") runPage();
  else if (page === "search") searchPage();
  else if (page === "compare") comparePage();
});
