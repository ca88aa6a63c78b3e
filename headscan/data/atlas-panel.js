// The head atlas, part 2 of 2: the tooltip, a head's panel, the search and the controls; it runs after
// atlas.js, in the same closure (headscan/report/atlas.py), and ends by drawing the grids.

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

function otherRows(model, index) {
  var out = "";
  (model.other || []).forEach(function (t) {
    var rows = [];
    t.at.forEach(function (at, i) { if (at === index) rows.push(i); });
    if (!rows.length) return;
    out += "<h4>" + esc(t.table) + "</h4><table class=\"atlas-scores\"><thead><tr>" +
      t.keys.map(function (k) { return "<th>" + esc(k) + "</th>"; }).join("") +
      '<th class="num">value</th>' + (t.low ? '<th class="num">95% interval</th>' : "") +
      "</tr></thead><tbody>" +
      rows.map(function (i) {  // a table without intervals (similarity) has no interval column
        return "<tr>" + t.cells[t.key[i]].map(function (k) { return "<td>" + esc(k) + "</td>"; }).join("") +
          '<td class="num">' + fmt(t.value[i]) + "</td>" +
          (t.low ? '<td class="num">' + interval(t.low[i], t.high[i]) + "</td>" : "") + "</tr>";
      }).join("") + "</tbody></table>";
  });
  return out;
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
  D.metrics.forEach(function (info) {
    var scores = model.metrics[info.name];
    if (!scores) return;
    var value = scores.value[index], rank = scores.rank[index];
    s += '<tr data-metric="' + esc(info.name) + '"' + (info.name === state.metric ? ' class="current"' : "") + "><td>" +
      esc(info.name) + '</td><td class="num value" data-value="' + (value === null ? "" : value) + '">' +
      fmt(value, info.name) + (isThin(scores, index) ? ' <span class="atlas-thin" title="thin support">\u2021</span>' : "") +
      '</td><td class="num">' + interval(scores.low[index], scores.high[index], info.name) + '</td><td class="num chance">' +
      fmt(scores.chance ? scores.chance[index] : null, info.name) + '</td><td class="num"' +
      ' title="' + esc(info.striking) + ' first">' + (rank === null ? "\u2013" : rank + " of " + scores.of +
      ' <span class="muted">' + (info.striking === "lowest" ? "low" : "high") + "</span>") + '</td><td class="muted">' +
      esc(value === null ? "" : unsupported(scores, index)) + "</td></tr>";
  });
  s += "</tbody></table>";
  s += '<p class="muted atlas-small">Rank 1 is the most striking head of the model: the highest value, or the lowest ' +
    "where low is striking (entropy: the most focused head). Chance: the value of uniform attention over the keys " +
    "each query sees, on the same queries. No claim: why the value cannot carry one (its interval is thin, or does " +
    "not lie beyond chance on the striking side). \u2021: thin support.</p>";
  if (model.importance) s += '<p class="muted atlas-small">' + esc(model.importance) + "</p>";
  var controls = (D.controls || {})[model.name] || [];
  controls.forEach(function (name) {
    var other = D.models.filter(function (x) { return x.name === name; })[0];
    if (!other || other.heads !== model.heads || other.layers !== model.layers) return;
    s += "<h4>Beside its control: " + named(name) + '</h4><table class="atlas-scores atlas-control"><thead><tr><th>metric</th>' +
      '<th class="num">' + named(model.name) + '</th><th class="num">control</th><th class="num">chance</th></tr></thead><tbody>';
    D.metrics.forEach(function (info) {
      var mine = model.metrics[info.name], theirs = other.metrics[info.name];
      if (!mine || !theirs) return;
      s += "<tr><td>" + esc(info.name) + '</td><td class="num">' + fmt(mine.value[index], info.name) +
        '</td><td class="num">' + fmt(theirs.value[index], info.name) + (unsupported(theirs, index) ?
          ' <span class="muted" title="' + esc(unsupported(theirs, index)) + '">(no claim)</span>' : "") +
        '</td><td class="num">' + fmt(theirs.chance ? theirs.chance[index] : null, info.name) + "</td></tr>";
    });
    s += "</tbody></table>";
  });
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
  (model.examples || []).forEach(function (example, k) {
    s += "<h4>Attention on " + esc(example.title || "example " + (k + 1)) + "</h4>" +
      '<p class="muted atlas-small">\u201c' + named(example.text) + "\u201d: rows are queries, columns the keys they attend to.</p>" +
      '<div class="atlas-scroll">' + exampleSvg(model, example, index) + "</div>";
  });
  if (!(model.examples || []).length) {
    s += '<p class="muted atlas-small">No example attention: the report was made without loading the models.</p>';
  }
  panel.innerHTML = s;
  panel.hidden = false;
  panel.querySelector(".atlas-close").addEventListener("click", closePanel);
}

function markOpen() {
  grids.querySelectorAll(".atlas-cell.open, .atlas-point.open").forEach(function (c) { c.classList.remove("open"); });
  if (!state.open) return;
  grids.querySelectorAll('[data-m="' + state.open[0] + '"][data-index="' + state.open[1] + '"]').forEach(function (c) {
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

select.value = state.metric;
drawGrids();
recolour();
root.classList.add("ready");
