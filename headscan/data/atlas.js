// The head atlas of a headscan report, part 1 of 2: the data, the colours and the grids (headscan/report/atlas.py
// writes the data and wraps this file and atlas-panel.js, in that order, in one strict-mode closure: they share
// its variables). Self-contained: reads the JSON in #atlas-data, loads nothing, works from file://.

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
