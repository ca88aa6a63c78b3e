// The script of a headscan report page (headscan/report/atlas.py puts it in the atlas; headscan/report/document.py
// at the end of a page without one that has sortable tables): it makes tables sortable and draws the head atlas.
// One strict-mode function: nothing leaks into the page's globals. Self-contained: reads the JSON in
// #atlas-data, loads nothing, works from file://.
(function () {
"use strict";

// --- sortable tables ------------------------------------------------------------------------------------

// Sorts a table.sortable by the clicked column: numbers as numbers ("–" and blanks last), text as text. Each
// table is wired once, even where the page holds this script twice.
function sortable(table) {
  if (table.hasAttribute("data-sorting")) return;
  table.setAttribute("data-sorting", "");
  table.querySelectorAll("th").forEach(function (th, column) {
    th.tabIndex = 0;
    function sort() {
      var up = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("th").forEach(function (other) { other.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      var numeric = th.classList.contains("num"), body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var text = row.cells[column] ? row.cells[column].textContent.trim() : "";
        if (!numeric) return text;
        var number = parseFloat(text.replace(/[^0-9eE+.-]/g, ""));
        return isNaN(number) ? null : number;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null || x === "") return y === null || y === "" ? 0 : 1;
        if (y === null || y === "") return -1;
        var order = numeric ? x - y : x.localeCompare(y);
        return up ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    }
    th.addEventListener("click", sort);
    th.addEventListener("keydown", function (event) { if (event.key === "Enter") sort(); });
  });
}

// The script may run before the tables below it are parsed (inside the atlas, at the top of the page).
function sortTables() { document.querySelectorAll("table.sortable").forEach(sortable); }
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", sortTables);
else sortTables();

// --- the head atlas: the data, the colours and the grids --------------------------------------------------

if (!document.getElementById("atlas-data")) return; // a page without the atlas: only its tables sort

var D = JSON.parse(document.getElementById("atlas-data").textContent);
var GRID_H = 420; // every model's grid is this tall, so rows line up by relative depth
var root = document.getElementById("atlas");
var grids = document.getElementById("atlas-grids");
var panel = document.getElementById("atlas-panel");
var tip = document.getElementById("atlas-tip");
var select = document.getElementById("atlas-metric");
var scaleSelect = document.getElementById("atlas-scale");
var search = document.getElementById("atlas-search");
var found = document.getElementById("atlas-found");
var legend = document.getElementById("atlas-legend");
var metricInfo = {};
D.metrics.forEach(function (m) { metricInfo[m.name] = m; });
var roleInfo = {};
D.roles.forEach(function (r) { roleInfo[r.name] = r; });
var state = { metric: D.initial, scale: "value", open: null };

// What the grids show: one grid per model, or per checkpoint series (D.series) one grid with a slider over its
// steps, the last step first. groups[g].models are indices into D.models; groups[g].at is the one shown.
var groups = [], groupOf = {};
(D.series || []).forEach(function (series) {
  series.models.forEach(function (m) { groupOf[m] = series; });
});
D.models.forEach(function (model, m) {
  var series = groupOf[m];
  if (series && series.group !== undefined) { groupOf[m] = series.group; return; }
  var group = series ? { models: series.models, steps: series.steps, name: series.name,
    at: series.models.length - 1 } : { models: [m], steps: null, at: 0 };
  if (series) series.group = groups.length;
  groupOf[m] = groups.length;
  groups.push(group);
});
function shownModel(g) { return groups[g].models[groups[g].at]; }

function esc(text) {
  return String(text).replace(/[&<>"']/g, function (c) {
    return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
  });
}

// A user-given name or sentence as HTML: escaped, and isolated, so a right-to-left override in it turns
// nothing after it (the head's label, the numbers).
function named(text) {
  return "<bdi>" + esc(text) + "</bdi>";
}

function hex(colour) {
  return [1, 3, 5].map(function (i) { return parseInt(colour.slice(i, i + 2), 16); });
}

function scaleColour(stops, t) {
  t = Math.max(0, Math.min(1, t));
  var x = t * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
  var a = hex(stops[i]), b = hex(stops[i + 1]);
  return "rgb(" + a.map(function (v, k) { return Math.round(v + (b[k] - v) * f); }).join(",") + ")";
}

function fmt(value, metric) {
  if (value === null || value === undefined) return "\u2013";
  var info = metricInfo[metric] || { bounded: true };
  var digits = info.bounded || Math.abs(value) < 1 ? 3 : 2;
  var text = value.toFixed(digits);
  // 0.99957 is not all of the attention, nor 0.0004 none of it: keep the digits that say so
  for (var more = 4; more <= 6 && info.bounded && ((text.indexOf("1.000") === 0 && value < 1) ||
      (/^0\.0+$/.test(text) && value > 0)); more += 1) {
    text = value.toFixed(more);
  }
  return /^(0\.0+|1\.0+)$/.test(text) && more > 4 ? value.toFixed(3) : text;
}

function interval(low, high, metric) {
  if (low === null || high === null || low === undefined || high === undefined) return "";
  return "[" + fmt(low, metric) + ", " + fmt(high, metric) + "]";
}

function label(model, index) {
  return "L" + Math.floor(index / model.heads) + "H" + (index % model.heads);
}

function isThin(scores, index) {
  return scores.thin.indexOf(index) >= 0;
}

function unsupported(scores, index) {
  return (scores.unsupported || {})[String(index)] || "";
}

// Colour by lift over chance: value - chance, or log2(value / chance) for shares; white at chance.
function lifted(scores, index, info) {
  var v = scores.value[index], c = scores.chance ? scores.chance[index] : null;
  if (v === null || v === undefined || c === null || c === undefined) return null;
  if (state.scale === "ratio") {
    if (!info.ratio || !(c > 0) || !(v > 0)) return null;
    return Math.log(v / c) / Math.LN2 / info.ratio;
  }
  return info.lift ? (v - c) / info.lift : null;
}

function familyColour(model, index) {
  var map = model.map;
  if (!map) return D.scales.undefined;
  var c = map.cluster[index];
  if (c === null || c === undefined) return D.scales.alone;
  return D.scales.families[map.order.indexOf(c) % D.scales.families.length];
}

// The head's cluster as the section "Head families" numbers it, and its members.
function family(model, index, most) {
  var map = model.map;
  if (!map) return null;
  var c = map.cluster[index];
  if (c === null || c === undefined) return { number: null, members: [] };
  var members = [];
  map.cluster.forEach(function (other, i) { if (other === c) members.push(label(model, i)); });
  var shown = most && members.length > most ? members.slice(0, most).join(", ") + " and " + (members.length - most) +
    " more" : members.join(", ");
  return { number: c, members: members, text: shown };
}

function fill(model, index) {
  if (state.metric === "@cluster") return familyColour(model, index);
  if (state.metric === "@role") {
    var roles = model.roles[index];
    return roles.length ? roleInfo[roles[0]].colour : "#f4f4f4";
  }
  var scores = model.metrics[state.metric];
  var value = scores ? scores.value[index] : null;
  if (value === null || value === undefined) return D.scales.undefined;
  var info = metricInfo[state.metric];
  if (state.scale !== "value") {
    var t = lifted(scores, index, info);
    return t === null ? D.scales.undefined : scaleColour(D.scales.signed, (t + 1) / 2);
  }
  return scaleColour(info.bounded ? D.scales.share : D.scales.unbounded, value / (info.max || 1));
}

// --- the grids ------------------------------------------------------------------------------------------

function attrs(map) {
  return Object.keys(map).map(function (k) { return " " + k + '="' + esc(map[k]) + '"'; }).join("");
}

function text(map, content) {
  return "<text" + attrs(map) + ">" + esc(content) + "</text>";
}

function depthAxis() {
  var box = document.createElement("div");
  box.className = "atlas-model atlas-depth";
  var mid = 24 + GRID_H / 2;
  var s = '<div class="atlas-title">&nbsp;</div><svg width="58" height="' + (GRID_H + 40) + '" aria-hidden="true">';
  [0, 0.25, 0.5, 0.75, 1].forEach(function (t) {
    var y = 24 + t * GRID_H;
    s += '<line x1="50" x2="56" y1="' + y + '" y2="' + y + '" stroke="#8c959f"/>' +
      text({ x: 47, y: y + 4, "text-anchor": "end", "class": "atlas-tick" }, t.toFixed(2));
  });
  s += '<line x1="56" x2="56" y1="24" y2="' + (24 + GRID_H) + '" stroke="#8c959f"/>' +
    text({ x: 12, y: mid, "class": "atlas-axis", transform: "rotate(-90 12 " + mid + ")", "text-anchor": "middle" },
      "relative depth") + "</svg>";
  box.innerHTML = s;
  return box;
}

function gridSvg(model, m, cw) {
  var rh = GRID_H / model.layers;
  var left = 34, top = 24;
  var s = "<svg" + attrs({ width: left + cw * model.heads + 4, height: top + GRID_H + 16, role: "img",
    "aria-label": model.name + ": layer by head grid" }) + ">";
  var headEvery = cw >= 16 ? 1 : (cw >= 9 ? 2 : 4);
  for (var h = 0; h < model.heads; h += headEvery) {
    s += text({ x: left + (h + 0.5) * cw, y: top - 6, "text-anchor": "middle", "class": "atlas-tick" }, "H" + h);
  }
  var layerEvery = Math.max(1, Math.ceil(12 / rh));
  for (var l = 0; l < model.layers; l += 1) {
    if (l % layerEvery === 0 || l === model.layers - 1) {
      s += text({ x: left - 4, y: top + (l + 0.5) * rh + 4, "text-anchor": "end", "class": "atlas-tick" }, "L" + l);
    }
  }
  for (var i = 0; i < model.layers * model.heads; i += 1) {
    var layer = Math.floor(i / model.heads), head = i % model.heads;
    s += "<rect" + attrs({ x: left + head * cw, y: top + layer * rh, width: cw - 1, height: Math.max(rh - 1, 1),
      "class": "atlas-cell", "data-model": model.name, "data-m": m, "data-index": i, "data-label": label(model, i),
      tabindex: 0, fill: fill(model, i) }) + "/>";
  }
  return s + "</svg>";
}

// The head map: classical MDS of the Jensen-Shannon distance (headscan.analysis.families.head_map), equal
// scales on both axes and no axis drawn (only distances mean something); each point coloured as its cell.
function mapSvg(model, m, width) {
  var map = model.map;
  if (!map) return "";
  var W = Math.max(width, 180), H = 170, pad = 8;
  var xs = [], ys = [];
  map.x.forEach(function (x, i) { if (x !== null) { xs.push(x); ys.push(map.y[i]); } });
  if (!xs.length) return "";
  var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
  var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
  var k = Math.min((W - 2 * pad) / ((x1 - x0) || 1), (H - 2 * pad) / ((y1 - y0) || 1));
  var cx = (W - k * (x1 - x0)) / 2, cy = (H - k * (y1 - y0)) / 2;
  var s = '<div class="atlas-map-title">head map: near points attend alike</div><svg' +
    attrs({ "class": "atlas-map", width: W, height: H, role: "img", "aria-label": model.name + ": head map" }) + ">";
  map.x.forEach(function (x, i) {
    if (x === null) return;
    s += "<circle" + attrs({ cx: (cx + k * (x - x0)).toFixed(1), cy: (H - cy - k * (map.y[i] - y0)).toFixed(1), r: 4,
      "class": "atlas-point", "data-model": model.name, "data-m": m, "data-index": i, "data-label": label(model, i),
      tabindex: 0, fill: fill(model, i) }) + "/>";
  });
  return s + "</svg>";
}

var cellWidth = 8;

function drawGroup(g) {
  var box = grids.querySelector('.atlas-model[data-group="' + g + '"]');
  var m = shownModel(g), model = D.models[m], group = groups[g];
  box.setAttribute("data-model", model.name);
  box.setAttribute("data-m", m);
  var title = "<b>" + named(group.steps ? group.name : model.name) + "</b> <span>" + esc(model.family) + ", " +
    model.layers + " \u00d7 " + model.heads + "</span>";
  box.querySelector(".atlas-title").innerHTML = title;
  if (group.steps) {
    box.querySelector(".atlas-step-shown").textContent = "step " + group.steps[group.at] + " (" + model.name + ")";
  }
  box.querySelector(".atlas-grid").innerHTML = gridSvg(model, m, cellWidth);
  box.querySelector(".atlas-map-box").innerHTML = mapSvg(model, m, 34 + cellWidth * model.heads + 4);
}

function drawGrids() {
  grids.appendChild(depthAxis());
  var totalHeads = 0;
  groups.forEach(function (_, g) { totalHeads += D.models[shownModel(g)].heads; });
  groups.forEach(function (group, g) {
    var model = D.models[shownModel(g)];
    var box = document.createElement("div");
    box.className = "atlas-model";
    box.setAttribute("data-group", g);
    var s = '<div class="atlas-title"></div><div class="atlas-grid"></div>';
    if (group.steps) {  // under the grid, so that every grid's rows stay level with the depth axis
      s += '<div class="atlas-steps"><input type="range" class="atlas-step"' + attrs({ min: 0,
        max: group.steps.length - 1, step: 1, value: group.at, "aria-label": group.name + ": training step" }) +
        '><span class="atlas-step-shown"></span></div>';
    }
    box.innerHTML = s + '<div class="atlas-why"></div><div class="atlas-map-box"></div>';
    grids.appendChild(box);
    cellWidth = Math.max(8, Math.min(24, Math.floor(300 / model.heads),
      Math.floor((880 - 58 - 48 * groups.length) / totalHeads)));
    box.setAttribute("data-cw", cellWidth);
    drawGroup(g);
    var slider = box.querySelector("input.atlas-step");
    if (slider) slider.addEventListener("input", function () { showStep(g, +slider.value); });
  });
}

// The slider of a series: its grid shows the checkpoint at position `at`; an open head's panel follows to the
// same head of that checkpoint, and the search marks that checkpoint's heads.
function showStep(g, at) {
  var group = groups[g], before = shownModel(g);
  group.at = at;
  tip.hidden = true;
  cellWidth = +grids.querySelector('.atlas-model[data-group="' + g + '"]').getAttribute("data-cw");
  drawGroup(g);
  recolour();
  drawScatter();
  if (search.value.trim()) find(search.value);
  if (state.open && state.open[0] === before) {
    var old = D.models[before], model = D.models[shownModel(g)];
    var layer = Math.floor(state.open[1] / old.heads), head = state.open[1] % old.heads;
    if (layer < model.layers && head < model.heads) openPanel(shownModel(g), layer * model.heads + head);
    else closePanel();
  }
}

function recolour() {
  var cells = grids.querySelectorAll("rect.atlas-cell, circle.atlas-point");
  for (var k = 0; k < cells.length; k += 1) {
    var cell = cells[k];
    cell.setAttribute("fill", fill(D.models[+cell.getAttribute("data-m")], +cell.getAttribute("data-index")));
  }
  grids.querySelectorAll(".atlas-model[data-group]").forEach(function (box) {
    var model = D.models[+box.getAttribute("data-m")];
    var scores = model.metrics[state.metric];
    var why = box.querySelector(".atlas-why");
    why.textContent = state.metric === "@cluster" ? (model.map ? "" : "no similarity table for this model") :
      scores && scores.why ? state.metric + ": " + scores.why + "." :
      (state.metric !== "@role" && !scores ? "no " + state.metric + " in this run" : "");
  });
  drawLegend();
}

function drawLegend() {
  if (state.metric === "@cluster") {
    legend.innerHTML = D.scales.families.slice(0, 6).map(function (c, k) {
      return '<span class="atlas-swatch"><i style="background:' + c + '"></i>' + (k === 0 ? "largest" : "") + "</span>";
    }).join("") + '<span class="atlas-swatch">…</span><span class="atlas-swatch"><i style="background:' +
      D.scales.alone + '"></i>alike no other head</span><span class="muted"> One colour per cluster of the model\'s ' +
      "heads (the section Head families: average linkage, cut at " + D.cut + " nats), largest first; colours repeat " +
      "after " + D.scales.families.length + '; <a href="#head-families">the clusters</a></span>';
    return;
  }
  if (state.metric === "@role") {
    legend.innerHTML = D.roles.map(function (r) {
      return '<span class="atlas-swatch"><i style="background:' + r.colour + '"></i>' + esc(r.name) + "</span>";
    }).join("") + '<span class="atlas-swatch"><i style="background:#f4f4f4"></i>none</span>' +
      '<span class="muted"> A head takes the colour of its first role in this order; the rules are under the atlas.</span>';
    return;
  }
  var info = metricInfo[state.metric];
  if (state.scale !== "value") {
    var end = state.scale === "ratio" ? info.ratio : info.lift;
    var signed = "linear-gradient(to right," + D.scales.signed.join(",") + ")";
    legend.innerHTML = end === null || end === undefined ?
      '<span class="muted">' + esc(state.metric) + ": no chance level to compare with" +
        (state.scale === "ratio" && !info.bounded ? " (value / chance is drawn for shares only)" : "") + "</span>" :
      '<span class="atlas-bar-end">' + (state.scale === "ratio" ? "\u00f7" + Math.pow(2, end).toPrecision(3) :
        "\u2212" + fmt(end, info.name)) + '</span><span class="atlas-bar" style="background:' + signed + '"></span>' +
      '<span class="atlas-bar-end">' + (state.scale === "ratio" ? "\u00d7" + Math.pow(2, end).toPrecision(3) :
        "+" + fmt(end, info.name)) + "</span> " + '<span class="muted">' +
      (state.scale === "ratio" ? "value / chance, on a log scale" : "value \u2212 chance, in " + esc(info.unit)) +
      "; white: at chance (uniform attention over the keys each query sees); " + esc(info.striking) +
      ' is striking; <span class="atlas-grey"></span> undefined</span>';
    return;
  }
  var stops = info.bounded ? D.scales.share : D.scales.unbounded;
  var gradient = "linear-gradient(to right," + stops.join(",") + ")";
  legend.innerHTML = '<span class="atlas-bar-end">0</span><span class="atlas-bar" style="background:' + gradient +
    '"></span><span class="atlas-bar-end">' + esc(fmt(info.max, info.name)) + "</span> " +
    '<span class="muted">' + esc(info.unit) + (info.bounded ? ", 0 to 1" : "") + "; " +
    esc(info.striking) + " is striking" + '; <span class="atlas-grey"></span> undefined; ' +
    '<a href="#metric-' + esc(info.name) + '">definition</a></span>';
}

// --- the head atlas: the tooltip, a head's panel, the search and the controls; it ends by drawing the grids ---

// --- hover ----------------------------------------------------------------------------------------------

function cellOf(event) {
  var t = event.target;
  return t && t.classList && (t.classList.contains("atlas-cell") || t.classList.contains("atlas-point")) ? t : null;
}

function familyLine(model, index) {
  var f = family(model, index, 8);
  if (!f) return "";
  return f.number === null ? "<br>alike no other head" :
    "<br>cluster " + f.number + " (" + f.members.length + " heads): " + esc(f.text);
}

// The tooltip: the head's value in what colours the grid, then its head family where the report has one.
function describe(model, index) {
  return "<b>" + named(model.name) + " " + label(model, index) + "</b>" + measured(model, index) +
    (familyLine(model, index) || (state.metric === "@cluster" ? "<br>no similarity table" : ""));
}

function measured(model, index) {
  if (state.metric === "@cluster") return "";
  if (state.metric === "@role") {
    var roles = model.roles[index];
    return "<br>" + (roles.length ? esc(roles.join(", ")) : "no role");
  }
  var scores = model.metrics[state.metric];
  if (!scores) return "<br>no " + esc(state.metric);
  var text = "<br>" + esc(state.metric) + " " + fmt(scores.value[index], state.metric) + " " +
    interval(scores.low[index], scores.high[index], state.metric);
  if (scores.chance && scores.chance[index] !== null) text += "<br>chance " + fmt(scores.chance[index], state.metric);
  if (isThin(scores, index)) text += ' <span class="atlas-thin">\u2021 thin support</span>';
  var reason = unsupported(scores, index);
  if (reason && reason !== "thin support") text += '<br><span class="muted">no claim: ' + esc(reason) + "</span>";
  if (scores.rank[index] !== null) text += "<br>rank " + scores.rank[index] + " of " + scores.of;
  return text;
}

grids.addEventListener("mousemove", function (event) {
  var cell = cellOf(event);
  if (!cell) { tip.hidden = true; return; }
  tip.innerHTML = describe(D.models[+cell.getAttribute("data-m")], +cell.getAttribute("data-index"));
  tip.hidden = false;
  var box = root.getBoundingClientRect();
  tip.style.left = (event.clientX - box.left + 14) + "px";
  tip.style.top = (event.clientY - box.top + 14) + "px";
});
grids.addEventListener("mouseleave", function () { tip.hidden = true; });
grids.addEventListener("click", function (event) {
  var cell = cellOf(event);
  if (cell) openPanel(+cell.getAttribute("data-m"), +cell.getAttribute("data-index"));
});
grids.addEventListener("keydown", function (event) {
  var cell = cellOf(event);
  if (cell && (event.key === "Enter" || event.key === " ")) {
    event.preventDefault();
    openPanel(+cell.getAttribute("data-m"), +cell.getAttribute("data-index"));
  }
});

// --- the panel ------------------------------------------------------------------------------------------

function offsetSvg(model, index) {
  var o = model.offsets;
  if (!o) return '<p class="muted">No offsets table in this run.</p>';
  var v = o.value[index], lo = o.low[index], hi = o.high[index], d = o.d;
  var W = 340, H = 150, L = 36, R = 8, T = 10, B = 28;
  var top = 0;
  v.concat(hi).forEach(function (x) { if (x !== null && x > top) top = x; });
  top = top > 0.5 ? 1 : Math.max(0.1, Math.ceil(top * 10 + 0.5) / 10);
  function X(k) { return L + (k / (d.length - 1)) * (W - L - R); }
  function Y(y) { return T + (1 - y / top) * (H - T - B); }
  var s = '<svg class="atlas-offsets" width="' + W + '" height="' + H + '" role="img" aria-label="offset profile">';
  s += '<line x1="' + L + '" x2="' + (W - R) + '" y1="' + Y(0) + '" y2="' + Y(0) + '" stroke="#8c959f"/>';
  var zero = d.indexOf(0);
  if (zero >= 0) s += '<line x1="' + X(zero) + '" x2="' + X(zero) + '" y1="' + T + '" y2="' + Y(0) + '" stroke="#d0d7de"/>';
  [0, top / 2, top].forEach(function (y) {
    s += '<text class="atlas-tick" x="' + (L - 4) + '" y="' + (Y(y) + 4) + '" text-anchor="end">' + y.toFixed(2) + "</text>";
  });
  d.forEach(function (x, k) {
    if (x % 2 === 0 || d.length <= 9) {
      s += '<text class="atlas-tick" x="' + X(k) + '" y="' + (H - B + 13) + '" text-anchor="middle">' + x + "</text>";
    }
  });
  s += '<text class="atlas-tick" x="' + ((L + W - R) / 2) + '" y="' + (H - 3) + '" text-anchor="middle">offset d (key = query + d)</text>';
  var band = [], line = [];
  d.forEach(function (_, k) { if (lo[k] !== null && hi[k] !== null) band.push(X(k) + "," + Y(hi[k])); });
  for (var k = d.length - 1; k >= 0; k -= 1) if (lo[k] !== null && hi[k] !== null) band.push(X(k) + "," + Y(lo[k]));
  if (band.length) s += '<polygon class="atlas-band" points="' + band.join(" ") + '"/>';
  d.forEach(function (_, k) { if (v[k] !== null) line.push(X(k) + "," + Y(v[k])); });
  s += '<polyline class="atlas-line" points="' + line.join(" ") + '"/>';
  d.forEach(function (x, k) {
    if (v[k] !== null) {
      s += '<circle cx="' + X(k) + '" cy="' + Y(v[k]) + '" r="2.6" class="atlas-dot"><title>d = ' + x + ": " +
        v[k].toFixed(3) + (lo[k] !== null ? " [" + lo[k].toFixed(3) + ", " + hi[k].toFixed(3) + "]" : "") + "</title></circle>";
    }
  });
  return s + "</svg>";
}

function exampleSvg(model, example, index) {
  var n = example.tokens.length;
  var raw = atob(example.bytes);
  var per = n * n, offset = index * per;
  var cell = Math.max(9, Math.min(18, Math.floor(330 / n)));
  var longest = 0;
  example.tokens.forEach(function (t) { longest = Math.max(longest, Math.min(t.length, 14)); });
  var L = 8 + longest * 6.4, T = 8 + longest * 6.4;
  var W = L + n * cell + 4, H = T + n * cell + 4;
  var s = '<svg class="atlas-example" width="' + W + '" height="' + H + '" role="img" aria-label="attention on the example">';
  example.tokens.forEach(function (t, q) {
    var shown = esc(t.length > 14 ? t.slice(0, 13) + "\u2026" : t);
    s += '<text class="atlas-token" x="' + (L - 4) + '" y="' + (T + (q + 0.5) * cell + 4) + '" text-anchor="end">' + shown + "</text>";
    var x = L + (q + 0.5) * cell + 4, y = T - 4;
    s += '<text class="atlas-token" x="' + x + '" y="' + y + '" transform="rotate(-90 ' + x + " " + y + ')">' + shown + "</text>";
  });
  var causal = model.family === "causal";
  for (var q = 0; q < n; q += 1) {
    for (var k = 0; k < n; k += 1) {
      if (causal && k > q) continue;
      var w = raw.charCodeAt(offset + q * n + k) / 255;
      s += '<rect x="' + (L + k * cell) + '" y="' + (T + q * cell) + '" width="' + (cell - 0.5) + '" height="' + (cell - 0.5) +
        '" fill="' + scaleColour(D.scales.share, w) + '"><title>' + esc(example.tokens[q]) + " \u2192 " + esc(example.tokens[k]) +
        ": " + w.toFixed(2) + "</title></rect>";
    }
  }
  return s + "</svg>";
}

// A head's panel reads in one screen: a table of more than SHORT rows folds into a <details> under its name and
// row count, the folds side by side on one line (an opened one takes the whole width), except that one whose rows
// rank (syntax, by accuracy above the baseline) shows its PREVIEW best first.
var SHORT = 1, PREVIEW = 5;

function otherRows(model, index) {
  var out = "", folds = [];
  (model.other || []).forEach(function (t) {
    var rows = [];
    t.at.forEach(function (at, i) { if (at === index) rows.push(i); });
    if (!rows.length) return;
    function table(list, sortable) {
      return '<table class="atlas-scores' + (sortable ? " sortable" : "") + '"><thead><tr>' +
        t.keys.map(function (k) { return "<th>" + esc(k) + "</th>"; }).join("") +
        '<th class="num">value</th>' + (t.low ? '<th class="num">95% interval</th>' : "") +
        "</tr></thead><tbody>" +
        list.map(function (i) {  // a table without intervals (similarity) has no interval column
          return "<tr>" + t.cells[t.key[i]].map(function (k) { return "<td>" + esc(k) + "</td>"; }).join("") +
            '<td class="num">' + fmt(t.value[i]) + "</td>" +
            (t.low ? '<td class="num">' + interval(t.low[i], t.high[i]) + "</td>" : "") + "</tr>";
        }).join("") + "</tbody></table>";
    }
    var title = '<h4 class="atlas-other">' + esc(t.table) + "</h4>";
    if (rows.length <= SHORT || (t.best && rows.length <= PREVIEW + 1)) {  // folding a row or two saves nothing
      out += title + table(rows, false);
    } else if (t.best) {
      var first = rows.slice().sort(function (a, b) {
        var x = t.best[a] === null ? -Infinity : t.best[a], y = t.best[b] === null ? -Infinity : t.best[b];
        return y - x || a - b;
      });
      out += title + '<p class="muted atlas-small">The ' + PREVIEW + " of highest " + esc(t.best_is) + " of its " +
        rows.length + " rows:</p>" + table(first.slice(0, PREVIEW), false) + '<details class="atlas-more"><summary>all ' +
        rows.length + " rows of " + esc(t.table) + "</summary>" + table(rows, true) + "</details>";
    } else {
      folds.push('<details class="atlas-more"><summary>' + title + ' <span class="muted">' + rows.length + " rows</span>" +
        "</summary>" + table(rows, true) + "</details>");
    }
  });
  return out + (folds.length ? '<div class="atlas-folds">' + folds.join("") + "</div>" : "");
}

function openPanel(m, index) {
  var model = D.models[m];
  state.open = [m, index];
  markOpen();
  var layer = Math.floor(index / model.heads), head = index % model.heads;
  var depth = model.layers > 1 ? layer / (model.layers - 1) : 0;
  var roles = model.roles[index];
  var s = '<header><h3>' + named(model.name) + " " + label(model, index) + '</h3><button type="button" class="atlas-close" ' +
    'aria-label="close">\u00d7</button></header>';
  s += '<p class="muted">' + esc(model.family) + "; layer " + layer + " of " + model.layers + " (relative depth " +
    depth.toFixed(2) + "), head " + head + " of " + model.heads + "</p>";
  var group = groups[groupOf[m]];
  if (group.steps) {
    var at = group.models.indexOf(m);
    s += '<p class="muted atlas-checkpoint">checkpoint ' + (at + 1) + " of " + group.steps.length + " of series " +
      named(group.name) + ": step " + group.steps[at] + " (the slider under its grid moves this panel along)</p>";
  }
  var f = family(model, index, 0);
  if (f) {
    s += '<p class="atlas-family">' + (f.number === null ? "Head family: alike no other head of " + named(model.name) +
      " (no cluster within " + D.cut + " nats)" : '<i style="background:' + familyColour(model, index) + '"></i>' +
      "Head family: cluster " + f.number + " of " + named(model.name) + ", " + f.members.length + " heads: " +
      esc(f.text)) + "</p>";
  }
  s += '<p class="atlas-badges">' + (roles.length ? roles.map(function (r) {
    return '<span class="atlas-badge" style="border-color:' + roleInfo[r].colour + '" title="' + esc(roleInfo[r].rule) + '">' +
      '<i style="background:' + roleInfo[r].colour + '"></i>' + esc(r) + "</span>";
  }).join("") : '<span class="muted">no role by the rules below the atlas</span>') + "</p>";
  s += '<table class="atlas-scores"><thead><tr><th>metric</th><th class="num">value</th><th class="num">95% interval</th>' +
    '<th class="num">chance</th><th class="num">rank</th><th>no claim</th></tr></thead><tbody>';
  var undefinedHere = [];  // said in one line under the table, not a row of dashes each
  D.metrics.forEach(function (info) {
    var scores = model.metrics[info.name];
    if (!scores) return;
    var value = scores.value[index], rank = scores.rank[index];
    if (value === null) {
      undefinedHere.push(info.name);
      return;
    }
    s += '<tr data-metric="' + esc(info.name) + '"' + (info.name === state.metric ? ' class="current"' : "") + "><td>" +
      esc(info.name) + '</td><td class="num value" data-value="' + (value === null ? "" : value) + '">' +
      fmt(value, info.name) + (isThin(scores, index) ? ' <span class="atlas-thin" title="thin support">\u2021</span>' : "") +
      '</td><td class="num">' + interval(scores.low[index], scores.high[index], info.name) + '</td><td class="num chance">' +
      fmt(scores.chance ? scores.chance[index] : null, info.name) + '</td><td class="num"' +
      ' title="' + esc(info.striking) + ' first">' + (rank === null ? "\u2013" : rank + " of " + scores.of) +
      '</td><td class="muted atlas-noclaim">' + esc(unsupported(scores, index)) + "</td></tr>";
  });
  s += "</tbody></table>";
  if (undefinedHere.length) {
    s += '<p class="muted atlas-small">Undefined for this head (no query counts for it): ' +
      undefinedHere.map(esc).join(", ") + ".</p>";
  }
  // what the columns mean, the same for every head: folded, so that the head's own numbers keep to one screen
  s += '<details class="atlas-more atlas-reading"><summary>how to read these scores</summary>' +
    '<p class="muted atlas-small">Rank 1: the model\'s highest value, or its lowest where low is striking (' +
    D.metrics.filter(function (m) { return m.striking === "lowest"; }).map(function (m) { return esc(m.name); })
      .join(", ") + "). Chance: uniform attention over the keys each query sees, on the same queries. No claim: why " +
    "the value cannot carry one (thin, or not beyond chance on the striking side). \u2021: thin support.</p>" +
    (model.importance ? '<p class="muted atlas-small">' + esc(model.importance) + "</p>" : "") + "</details>";
  s += corpusExamples(model, index);
  var controls = (D.controls || {})[model.name] || [], beside = "", besideCount = 0;
  controls.forEach(function (name) {
    var other = D.models.filter(function (x) { return x.name === name; })[0];
    if (!other || other.heads !== model.heads || other.layers !== model.layers) return;
    besideCount += 1;
    var s = "";
    s += '<details class="atlas-more"><summary><h4>Beside its control: ' + named(name) + "</h4></summary>" +
      '<table class="atlas-scores atlas-control"><thead><tr><th>metric</th>' +
      '<th class="num">' + named(model.name) + '</th><th class="num">control</th><th class="num">chance</th></tr></thead><tbody>';
    D.metrics.forEach(function (info) {
      var mine = model.metrics[info.name], theirs = other.metrics[info.name];
      if (!mine || !theirs) return;
      s += "<tr><td>" + esc(info.name) + '</td><td class="num">' + fmt(mine.value[index], info.name) +
        '</td><td class="num">' + fmt(theirs.value[index], info.name) + (unsupported(theirs, index) ?
          ' <span class="muted" title="' + esc(unsupported(theirs, index)) + '">(no claim)</span>' : "") +
        '</td><td class="num">' + fmt(theirs.chance ? theirs.chance[index] : null, info.name) + "</td></tr>";
    });
    s += "</tbody></table></details>";
    beside += s;
  });
  // a run with several controls (five random-init copies and shuffled words) folds them all under one line,
  // so the panel keeps to one screen; one control keeps its own fold
  if (besideCount > 1) {
    s += '<details class="atlas-more"><summary><h4>Beside its ' + besideCount + " controls</h4></summary>" +
      beside + "</details>";
  } else {
    s += beside;
  }
  var widest = 0;
  if (model.offsets) {
    model.offsets.low[index].forEach(function (lo, k) {
      var hi = model.offsets.high[index][k];
      if (lo !== null && hi !== null) widest = Math.max(widest, hi - lo);
    });
  }
  s += "<h4>Offset profile</h4>" + offsetSvg(model, index) +
    '<p class="muted atlas-small">Mean attention on the key at query + d; the band is the 95% interval' +
    (model.offsets && widest < 0.01 ? " (here at most " + widest.toFixed(3) + " wide: thinner than the line)" : "") +
    ".</p>";
  s += otherRows(model, index);
  (model.examples || []).forEach(function (example, k) {  // folded: a grid as tall as the panel's scores
    s += '<details class="atlas-more atlas-example-attention"><summary><h4>Attention on ' +
      esc(example.title || "example " + (k + 1)) + "</h4></summary>" +
      '<p class="muted atlas-small">\u201c' + named(example.text) + "\u201d: rows are queries, columns the keys they attend to.</p>" +
      '<div class="atlas-scroll">' + exampleSvg(model, example, index) + "</div></details>";
  });
  if (!(model.examples || []).length) {
    s += '<p class="muted atlas-small">No example attention: the report was made without loading the models.</p>';
  }
  panel.innerHTML = s;
  panel.querySelectorAll("table.sortable").forEach(sortable);
  panel.hidden = false;
  panel.querySelector(".atlas-close").addEventListener("click", closePanel);
}

function markOpen() {
  root.querySelectorAll(".atlas-cell.open, .atlas-point.open, .atlas-scatter-point.open").forEach(function (c) { c.classList.remove("open"); });
  if (!state.open) return;
  root.querySelectorAll('[data-m="' + state.open[0] + '"][data-index="' + state.open[1] + '"]').forEach(function (c) {
    c.classList.add("open");
  });
}

function closePanel() {
  panel.hidden = true;
  state.open = null;
  markOpen();
}

// --- search ---------------------------------------------------------------------------------------------

function find(query) {
  grids.querySelectorAll("rect.atlas-cell.found").forEach(function (c) { c.classList.remove("found"); });
  var match = /^\s*(?:(.*?)\s+)?L(\d+)\s*H(\d+)\s*$/i.exec(query);
  if (!query.trim()) { found.textContent = ""; return []; }
  if (!match) { found.textContent = "type a label such as L4H11, or model L4H11"; return []; }
  var name = (match[1] || "").toLowerCase(), layer = +match[2], head = +match[3], hits = [];
  groups.forEach(function (_, g) {  // of a series, only the checkpoint its slider shows
    var m = shownModel(g), model = D.models[m];
    if (name && model.name.toLowerCase().indexOf(name) < 0) return;
    if (layer < model.layers && head < model.heads) hits.push([m, layer * model.heads + head]);
  });
  hits.forEach(function (hit) {
    var cell = grids.querySelector('rect.atlas-cell[data-m="' + hit[0] + '"][data-index="' + hit[1] + '"]');
    if (cell) cell.classList.add("found");
  });
  var text = "L" + layer + "H" + head;
  found.textContent = hits.length ? text + " in " + hits.map(function (h) { return D.models[h[0]].name; }).join(", ") +
    " (Enter opens it)" : "no " + text + " in " + (name ? "a model named like \u201c" + match[1] + "\u201d" : "any model");
  return hits;
}

search.addEventListener("input", function () { find(search.value); });
search.addEventListener("keydown", function (event) {
  if (event.key !== "Enter") return;
  var hits = find(search.value);
  if (hits.length) openPanel(hits[0][0], hits[0][1]);
});
select.addEventListener("change", function () {
  state.metric = select.value;
  recolour();
  if (state.open) openPanel(state.open[0], state.open[1]);
});
if (scaleSelect) {
  scaleSelect.addEventListener("change", function () {
    state.scale = scaleSelect.value;
    recolour();
  });
}
document.addEventListener("keydown", function (event) { if (event.key === "Escape") closePanel(); });

/* atlas_views.js */

select.value = state.metric;
drawGrids();
recolour();
drawScatter();
root.classList.add("ready");
})();
