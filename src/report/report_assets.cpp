// The training report page's style sheet and script (html_report.h). The script reads the
// plots' data from the page's run-data block and makes each line plot interactive: hovering shows
// the values of every series at the nearest iteration; dragging across a plot zooms to that range
// of iterations (the y axis fits the visible points); a double click zooms out. A location hash
// "#zoom=ID:FROM:TO[;ID:FROM:TO]" opens plots zoomed (shareable links). Redrawing follows the
// geometry and tick rules of svg_plot.cpp. When the script has wired every plot it sets the body's
// data-interactive attribute to their number.
#include "report/html_report.h"

namespace megatron::report {

const char* report_style() {
  return R"CSS(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#555;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card .label{font-size:12px;color:#666}.card .value{font-size:17px;font-weight:600}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
figure{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:8px;position:relative}
figcaption{font-weight:600;font-size:14px}.note{font-size:12px;color:#666;margin-top:2px}
svg.chart{width:100%;height:auto;display:block;user-select:none}
svg.chart .frame{fill:none;stroke:#bbb}svg.chart .grid{stroke:#eee}
svg.chart text{font-size:11px;fill:#444}svg.chart .ytick{text-anchor:end}
svg.chart .xtick,svg.chart .xlabel,svg.chart .ylabel,svg.chart .empty{text-anchor:middle}
svg.chart path{fill:none;stroke-width:1.6}svg.chart .cursor{stroke:#999;stroke-dasharray:3 3}
svg.chart .selection{fill:rgba(31,119,180,.12);stroke:none}
.tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #ccc;
 border-radius:4px;padding:4px 6px;font-size:12px;white-space:nowrap;display:none}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
details summary{cursor:pointer}code{font-size:12px}
)CSS";
}

const char* report_script() {
  return R"JS(
(function () {
  var data = JSON.parse(document.getElementById('run-data').textContent);
  var W = 640, H = 280, L = 70, R = 16, T = 16, B = 40, NS = 'http://www.w3.org/2000/svg';
  function label(v) {
    if (v === 0) return '0';
    var a = Math.abs(v);
    return (a >= 1e5 || a < 1e-3) ? v.toExponential(2) : String(Number(v.toPrecision(4)));
  }
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    var raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
    var step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag, t = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
      t.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return t;
  }
  function axis(lo, hi, log) {
    return function (v, a, b) {
      var l = log ? Math.log10(lo) : lo, h = log ? Math.log10(hi) : hi;
      var x = log ? Math.log10(Math.max(v, lo)) : v;
      return a + (h > l ? (x - l) / (h - l) : 0.5) * (b - a);
    };
  }
  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // Redraws a line plot over iterations [x0, x1] (the y range fits the visible points).
  function draw(fig, plot, x0, x1) {
    var svg = fig.querySelector('svg.chart');
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var y0 = Infinity, y1 = -Infinity;
    plot.series.forEach(function (s) {
      s.x.forEach(function (x, i) {
        if (x >= x0 && x <= x1 && isFinite(s.y[i])) { y0 = Math.min(y0, s.y[i]); y1 = Math.max(y1, s.y[i]); }
      });
    });
    svg.appendChild(el('rect', {'class': 'frame', x: L, y: T, width: W - L - R, height: H - T - B}));
    svg.appendChild(el('text', {'class': 'xlabel', x: (L + W - R) / 2, y: H - 6}, plot.x_label));
    svg.appendChild(el('text', {'class': 'ylabel', transform: 'translate(14,' + (T + H - B) / 2 + ') rotate(-90)'}, plot.y_label));
    if (!isFinite(y0)) { svg.appendChild(el('text', {'class': 'empty', x: 320, y: 140}, 'no data in this range')); return; }
    var log = y0 > 0 && y1 / y0 > 100, lo = y0, hi = y1;
    if (!log) { var pad = y1 > y0 ? 0.05 * (y1 - y0) : Math.max(1e-12, Math.abs(y0) * 0.05 + 1e-12); lo -= pad; hi += pad; }
    var fx = axis(x0, x1, false), fy = axis(lo, hi, log), ticks = [];
    if (log) { for (var e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) { var p = Math.pow(10, e); if (p >= lo * (1 - 1e-9) && p <= hi * (1 + 1e-9)) ticks.push(p); } }
    else ticks = niceTicks(lo, hi, 5);
    ticks.forEach(function (t) {
      var py = fy(t, H - B, T);
      svg.appendChild(el('line', {'class': 'grid', x1: L, x2: W - R, y1: py, y2: py}));
      svg.appendChild(el('text', {'class': 'ytick', x: L - 6, y: py + 4}, label(t)));
    });
    niceTicks(x0, x1, 6).forEach(function (t) {
      svg.appendChild(el('text', {'class': 'xtick', x: fx(t, L, W - R), y: H - B + 16}, label(t)));
    });
    var g = el('g', {'class': 'data'});
    plot.series.forEach(function (s) {
      var d = '';
      s.x.forEach(function (x, i) {
        if (x >= x0 && x <= x1 && isFinite(s.y[i])) d += (d ? 'L' : 'M') + fx(x, L, W - R).toFixed(1) + ',' + fy(s.y[i], H - B, T).toFixed(1);
      });
      if (!s.markers) { var a = {d: d, stroke: s.color}; if (s.dashed) a['stroke-dasharray'] = '6 4'; g.appendChild(el('path', a)); }
      if (s.markers) s.x.forEach(function (x, i) {
        if (x >= x0 && x <= x1 && isFinite(s.y[i])) g.appendChild(el('circle', {cx: fx(x, L, W - R), cy: fy(s.y[i], H - B, T), r: 3, fill: s.color}));
      });
    });
    svg.appendChild(g);
    var lx = L + 8;
    plot.series.forEach(function (s) {
      svg.appendChild(el('rect', {x: lx, y: T + 4, width: 12, height: 4, fill: s.color}));
      svg.appendChild(el('text', {x: lx + 16, y: T + 10}, s.name));
      lx += 24 + 6.2 * s.name.length;
    });
    fig.dataset.from = x0; fig.dataset.to = x1;
  }
  function extent(plot) {
    var a = Infinity, b = -Infinity;
    plot.series.forEach(function (s) { s.x.forEach(function (x) { a = Math.min(a, x); b = Math.max(b, x); }); });
    if (a === b) { a -= 1; b += 1; }
    return [a, b];
  }
  function wire(fig, plot) {
    var svg = fig.querySelector('svg.chart'), tip = document.createElement('div'), full = extent(plot), start = null, sel = null;
    tip.className = 'tip'; fig.appendChild(tip);
    function dataX(ev) {
      var r = svg.getBoundingClientRect(), px = (ev.clientX - r.left) * W / r.width;
      var x0 = +fig.dataset.from, x1 = +fig.dataset.to;
      return {px: px, x: x0 + (px - L) / (W - L - R) * (x1 - x0)};
    }
    svg.addEventListener('mousemove', function (ev) {
      var p = dataX(ev), old = svg.querySelector('.cursor');
      if (old) old.remove();
      if (start !== null) {
        if (sel) sel.remove();
        sel = el('rect', {'class': 'selection', x: Math.min(start, p.px), y: T, width: Math.abs(p.px - start), height: H - T - B});
        svg.appendChild(sel);
      }
      if (p.px < L || p.px > W - R) { tip.style.display = 'none'; return; }
      svg.appendChild(el('line', {'class': 'cursor', x1: p.px, x2: p.px, y1: T, y2: H - B}));
      var lines = [];
      plot.series.forEach(function (s) {
        var best = -1;
        s.x.forEach(function (x, i) { if (best < 0 || Math.abs(x - p.x) < Math.abs(s.x[best] - p.x)) best = i; });
        if (best >= 0) lines.push(s.name + ' @ ' + s.x[best] + ': ' + label(s.y[best]));
      });
      tip.textContent = ''; lines.forEach(function (t) { var d = document.createElement('div'); d.textContent = t; tip.appendChild(d); });
      var r = fig.getBoundingClientRect();
      tip.style.left = (ev.clientX - r.left + 12) + 'px'; tip.style.top = (ev.clientY - r.top + 12) + 'px'; tip.style.display = 'block';
    });
    svg.addEventListener('mouseleave', function () { tip.style.display = 'none'; var c = svg.querySelector('.cursor'); if (c) c.remove(); });
    svg.addEventListener('mousedown', function (ev) { start = dataX(ev).px; ev.preventDefault(); });
    window.addEventListener('mouseup', function (ev) {
      if (start === null) return;
      var a = start, p = dataX(ev); start = null; if (sel) { sel.remove(); sel = null; }
      if (Math.abs(p.px - a) < 5) return;
      var x0 = +fig.dataset.from, x1 = +fig.dataset.to, k = (x1 - x0) / (W - L - R);
      draw(fig, plot, x0 + (Math.min(a, p.px) - L) * k, x0 + (Math.max(a, p.px) - L) * k);
    });
    svg.addEventListener('dblclick', function () { draw(fig, plot, full[0], full[1]); });
    fig.dataset.from = full[0]; fig.dataset.to = full[1];
  }
  var wired = 0;
  document.querySelectorAll('figure[data-plot]').forEach(function (fig) {
    var plot = data.plots[fig.dataset.plot];
    if (!plot || plot.bars) return;
    wire(fig, plot); wired++;
  });
  (location.hash.match(/zoom=([^&]*)/) || [null, ''])[1].split(';').forEach(function (z) {
    var p = decodeURIComponent(z).split(':'), fig = document.querySelector('figure[data-plot="' + p[0] + '"]');
    if (fig && data.plots[p[0]] && p.length === 3) draw(fig, data.plots[p[0]], +p[1], +p[2]);
  });
  document.body.dataset.interactive = String(wired);
})();
)JS";
}

}  // namespace megatron::report
