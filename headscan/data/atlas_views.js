// --- each head's examples from the corpus (examples.parquet, headscan.report.atlas_units) ----------------

// The metric whose examples the panel shows: the one colouring the grids where the sweep kept examples of it,
// else the metric this head ranks best on among those with examples.
function exampleMetric(model, index) {
  var ex = model.corpus_examples;
  if (!ex) return null;
  if (ex.metrics[state.metric]) return state.metric;
  var best = null, bestRank = Infinity;
  Object.keys(ex.metrics).forEach(function (name) {
    var scores = model.metrics[name];
    var rank = scores ? scores.rank[index] : null;
    if (rank !== null && rank < bestRank) { best = name; bestRank = rank; }
  });
  return best || Object.keys(ex.metrics)[0] || null;
}

var EXAMPLE_CHARS = 240; // characters of an example's text shown; the whole text is its tooltip

function corpusExamples(model, index) {
  var ex = model.corpus_examples;
  if (!ex) {
    return '<p class="muted atlas-small">No examples from the corpus here: the sweep kept none (--examples 0), or ' +
      "this is a control model, whose examples the page leaves out (they are in examples.parquet).</p>";
  }
  var metric = exampleMetric(model, index);
  var rows = metric ? ex.metrics[metric][index] || [] : [];
  if (!rows.length) return "";
  var scores = model.metrics[metric];
  var s = '<h4 class="atlas-units-title">Where it does this most and least: ' + esc(metric) + "</h4>" +
    '<table class="atlas-scores atlas-units"><thead><tr><th></th><th class="num">value</th><th class="num">queries</th>' +
    "<th>text of the unit</th></tr></thead><tbody>";
  rows.forEach(function (row) {
    var text = ex.texts[row[2]];
    var shown = text.length > EXAMPLE_CHARS ? text.slice(0, EXAMPLE_CHARS - 1) + "\u2026" : text;
    s += '<tr class="' + (row[0] === 0 ? "top" : "bottom") + '"><td class="muted">' + (row[0] === 0 ? "top " : "bottom ") +
      row[1] + '</td><td class="num">' + fmt(row[3], metric) + '</td><td class="num">' + (row[4] === null ? "\u2013" : row[4]) +
      '</td><td class="atlas-unit-text" title="' + esc(text) + '">' + named(shown) + "</td></tr>";
  });
  s += "</tbody></table>";
  return s + '<p class="muted atlas-small">The units the bootstrap resampled where it scores highest and lowest on ' +
    esc(metric) + ", each unit's own value" +
    (scores ? " (the whole corpus: " + fmt(scores.value[index], metric) + ")" : "") + ". The sweep keeps their " +
    "text and value, not the head's attention on it" + ((model.examples || []).length ?
      ": the attention below is on fixed example sentences." : ".") +
    (ex.metrics[state.metric] ? "" : " The grids are coloured by a metric without examples, so these are for the " +
      "metric this head ranks best on.") + "</p>";
}

// --- heads as points: any two per-head quantities as axes and a third as colour, one plot per model --------

var scatter = document.getElementById("atlas-scatter");
var quantities = {}, quantityOrder = [];

function addQuantity(key, name, get) {
  quantities[key] = { name: name, get: get };
  quantityOrder.push(key);
}

addQuantity("@depth", "relative depth (layer / last layer)", function (model, i) {
  return model.layers > 1 ? Math.floor(i / model.heads) / (model.layers - 1) : 0;
});
D.metrics.forEach(function (info) {
  addQuantity(info.name, info.name, function (model, i) {
    var scores = model.metrics[info.name];
    return scores ? scores.value[i] : null;
  });
});
D.metrics.forEach(function (info) {
  addQuantity("lift:" + info.name, info.name + " \u2212 chance", function (model, i) {
    var scores = model.metrics[info.name];
    if (!scores || !scores.chance) return null;
    var v = scores.value[i], c = scores.chance[i];
    return v === null || c === null ? null : v - c;
  });
});

var scatterState = { x: metricInfo.first_token ? "first_token" : "@depth", y: D.initial, colour: "@depth" };
if (scatterState.x === scatterState.y) scatterState.x = "@depth";

function quantitySelect(which, label) {
  return "<label>" + label + ' <select data-axis="' + which + '">' + quantityOrder.map(function (key) {
    return '<option value="' + esc(key) + '"' + (scatterState[which] === key ? " selected" : "") + ">" +
      esc(quantities[key].name) + "</option>";
  }).join("") + "</select></label>";
}

function ticks(lo, hi) {
  return [lo, (lo + hi) / 2, hi];
}

function tickText(v) {
  var a = Math.abs(v);
  return a !== 0 && (a < 0.01 || a >= 1000) ? v.toExponential(1) : (+v.toPrecision(3)).toString();
}

function scatterSvg(model, m) {
  var W = 300, H = 250, L = 46, R = 8, T = 10, B = 34;
  var x = quantities[scatterState.x].get, y = quantities[scatterState.y].get, c = quantities[scatterState.colour].get;
  var points = [], missing = 0;
  for (var i = 0; i < model.layers * model.heads; i += 1) {
    var px = x(model, i), py = y(model, i);
    if (px === null || py === null || px === undefined || py === undefined) { missing += 1; continue; }
    points.push([i, px, py, c(model, i)]);
  }
  if (!points.length) return '<p class="muted atlas-small">' + named(model.name) + ": no head has both quantities.</p>";
  function range(k) {
    var lo = Infinity, hi = -Infinity;
    points.forEach(function (p) { if (p[k] !== null && p[k] !== undefined) { lo = Math.min(lo, p[k]); hi = Math.max(hi, p[k]); } });
    if (lo === Infinity) return null;
    return lo === hi ? [lo - 0.5, hi + 0.5] : [lo, hi];
  }
  var rx = range(1), ry = range(2), rc = range(3);
  function X(v) { return L + (v - rx[0]) / (rx[1] - rx[0]) * (W - L - R); }
  function Y(v) { return T + (1 - (v - ry[0]) / (ry[1] - ry[0])) * (H - T - B); }
  var signed = rc && rc[0] < 0 && rc[1] > 0;
  var stops = signed ? D.scales.signed : D.scales.unbounded;
  function colour(v) {
    if (v === null || v === undefined || !rc) return D.scales.undefined;
    if (signed) { var top = Math.max(-rc[0], rc[1]); return scaleColour(stops, 0.5 + v / (2 * top)); }
    return scaleColour(stops, (v - rc[0]) / (rc[1] - rc[0]));
  }
  var s = '<div class="atlas-scatter-plot"><div class="atlas-title"><b>' + named(model.name) + "</b> <span>" +
    points.length + " heads" + (missing ? ", " + missing + " without both values" : "") + "</span></div><svg" +
    attrs({ width: W, height: H, role: "img", "aria-label": model.name + ": heads as points" }) + ">";
  ticks(rx[0], rx[1]).forEach(function (v) {
    s += '<line x1="' + X(v) + '" x2="' + X(v) + '" y1="' + T + '" y2="' + (H - B) + '" stroke="#eaeef2"/>' +
      text({ x: X(v), y: H - B + 13, "text-anchor": "middle", "class": "atlas-tick" }, tickText(v));
  });
  ticks(ry[0], ry[1]).forEach(function (v) {
    s += '<line x1="' + L + '" x2="' + (W - R) + '" y1="' + Y(v) + '" y2="' + Y(v) + '" stroke="#eaeef2"/>' +
      text({ x: L - 4, y: Y(v) + 3, "text-anchor": "end", "class": "atlas-tick" }, tickText(v));
  });
  s += text({ x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", "class": "atlas-axis" }, quantities[scatterState.x].name);
  s += text({ x: 10, y: (T + H - B) / 2, "text-anchor": "middle", "class": "atlas-axis",
    transform: "rotate(-90 10 " + (T + H - B) / 2 + ")" }, quantities[scatterState.y].name);
  points.forEach(function (p) {
    s += "<circle" + attrs({ cx: X(p[1]).toFixed(1), cy: Y(p[2]).toFixed(1), r: 3.6, "class": "atlas-scatter-point",
      "data-model": model.name, "data-m": m, "data-index": p[0], "data-label": label(model, p[0]), tabindex: 0,
      fill: colour(p[3]) }) + "/>";
  });
  s += "</svg>";
  if (rc) {
    s += '<div class="atlas-scatter-key">colour: ' + esc(quantities[scatterState.colour].name) + " " + tickText(rc[0]) +
      ' <span class="atlas-bar" style="width:90px;background:linear-gradient(to right,' + stops.join(",") + ')"></span> ' +
      tickText(rc[1]) + "</div>";
  }
  return s + "</div>";
}

function drawScatter() {
  if (!scatter) return;
  var s = '<h4>Heads as points</h4><div class="atlas-controls">' + quantitySelect("x", "x") + quantitySelect("y", "y") +
    quantitySelect("colour", "colour") + '</div><div class="atlas-scatter-plots">';
  groups.forEach(function (_, g) { var m = shownModel(g); s += scatterSvg(D.models[m], m); });
  scatter.innerHTML = s + '</div><p class="muted atlas-small">Every head of each model as a point; a point opens ' +
    "its head. \u2212 chance: the value less the value of uniform attention on the same queries.</p>";
  markOpen();
}

function scatterPoint(event) {
  var t = event.target;
  return t && t.classList && t.classList.contains("atlas-scatter-point") ? t : null;
}

if (scatter) {
  scatter.addEventListener("change", function (event) {
    var axis = event.target.getAttribute("data-axis");
    if (!axis) return;
    scatterState[axis] = event.target.value;
    drawScatter();
  });
  scatter.addEventListener("click", function (event) {
    var point = scatterPoint(event);
    if (point) openPanel(+point.getAttribute("data-m"), +point.getAttribute("data-index"));
  });
  scatter.addEventListener("mousemove", function (event) {
    var point = scatterPoint(event);
    if (!point) { tip.hidden = true; return; }
    var model = D.models[+point.getAttribute("data-m")], i = +point.getAttribute("data-index");
    tip.innerHTML = "<b>" + named(model.name) + " " + label(model, i) + "</b>" + ["x", "y", "colour"].map(function (axis) {
      var value = quantities[scatterState[axis]].get(model, i);
      return "<br>" + esc(quantities[scatterState[axis]].name) + " " + (value === null ? "\u2013" : tickText(value));
    }).join("");
    tip.hidden = false;
    var box = root.getBoundingClientRect();
    tip.style.left = (event.clientX - box.left + 14) + "px";
    tip.style.top = (event.clientY - box.top + 14) + "px";
  });
  scatter.addEventListener("mouseleave", function () { tip.hidden = true; });
}
