(function () {
  "use strict";
  var svg = document.getElementById("timeline");
  if (!svg || !svg.createSVGPoint || !svg.querySelectorAll) return;
  var NS = svg.namespaceURI;
  var X0 = +svg.getAttribute("data-plot-x"), W = +svg.getAttribute("data-plot-w");
  var FROM = +svg.getAttribute("data-from-us"), DUR = +svg.getAttribute("data-duration-us");
  var TOP = +svg.getAttribute("data-top"), BOTTOM = +svg.getAttribute("data-bottom");
  var ROWS = +svg.getAttribute("data-label-rows"), ROW_H = +svg.getAttribute("data-row-h");
  var MAX_ZOOM = 5000;
  var view = [X0, X0 + W];
  var tip = document.getElementById("tip");
  var controls = document.getElementById("zoom-controls");
  var shown = document.getElementById("zoom-range");

  // The titles become tooltips shown at once; the static page keeps them.
  Array.prototype.forEach.call(svg.querySelectorAll("title"), function (t) {
    t.parentNode.setAttribute("data-tip", t.textContent);
    t.parentNode.removeChild(t);
  });

  var items = [];
  Array.prototype.forEach.call(svg.querySelectorAll(".zoom rect, .zoom circle, .zoom path"), function (el) {
    var tag = el.tagName.toLowerCase();
    if (tag === "rect") items.push([el, 0, +el.getAttribute("x"), +el.getAttribute("width")]);
    else if (tag === "circle") items.push([el, 1, +el.getAttribute("cx")]);
    else items.push([el, 2, el.getAttribute("d")]);
  });
  var labels = Array.prototype.map.call(svg.querySelectorAll("text.fault-label"), function (el) {
    var n = el.getAttribute("data-window");
    return { el: el, n: n, full: el.getAttribute("data-full"),
      x0: +el.getAttribute("data-x0"), x1: +el.getAttribute("data-x1"),
      band: svg.querySelector("g.fault-window[data-window='" + n + "'] rect.fault") };
  });

  function scale() { return W / (view[1] - view[0]); }
  function map(x) { return X0 + (x - view[0]) * scale(); }
  function unmap(x) { return view[0] + (x - X0) / scale(); }
  function ms(x) { return (FROM + (x - X0) / W * DUR) / 1000; }
  function nice(raw) {
    if (!(raw > 0) || !isFinite(raw)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function ticks() {
    var g = svg.querySelector("g.ticks");
    while (g.firstChild) g.removeChild(g.firstChild);
    var t0 = ms(view[0]), t1 = ms(view[1]), span = t1 - t0;
    var step = nice(span / 10), digits, label;
    for (;;) {
      digits = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
      label = (t1).toFixed(digits);
      if (step / span * W >= (label.length + 1) * 7 + 12) break;
      step = nice(step * 1.01);
    }
    for (var i = Math.ceil(t0 / step - 1e-9); i * step <= t1 + step * 1e-9; i++) {
      var x = (map(X0 + (i * step * 1000 - FROM) / DUR * W)).toFixed(1);
      g.appendChild(el("line", { "class": "grid", x1: x, y1: TOP, x2: x, y2: BOTTOM }));
      g.appendChild(el("line", { x1: x, y1: BOTTOM, x2: x, y2: BOTTOM + 5, stroke: "#888" }));
      g.appendChild(el("text", { "class": "tick-label", x: x, y: BOTTOM + 18, "text-anchor": "middle" },
        String(+(i * step).toFixed(digits))));
    }
  }

  function band(l, y) {
    if (!l.band) return;
    l.band.setAttribute("y", y);
    l.band.setAttribute("height", BOTTOM - y);
  }

  // The same packing as the static page, in the rows it has, with the
  // widths the browser measures.
  function layoutLabels() {
    var rows = [];
    for (var r = 0; r < ROWS; r++) rows.push([]);
    var visible = labels.map(function (l) { return { l: l, a: map(l.x0), b: map(l.x1) }; })
      .filter(function (v) {
        v.l.el.setAttribute("display", "none");
        band(v.l, TOP);
        return v.b >= X0 && v.a <= X0 + W;
      })
      .sort(function (p, q) { return p.a - q.a || p.l.n - q.l.n; });
    visible.forEach(function (v) {
      // Measured while shown: a hidden text measures 0.
      v.l.el.removeAttribute("display");
      var texts = [v.l.full, "#" + v.l.n];
      for (var t = 0; t < texts.length; t++) {
        v.l.el.textContent = texts[t];
        var w = v.l.el.getComputedTextLength();
        var x = Math.max(X0, Math.min(Math.max(v.a, X0) + 3, X0 + W - w));
        for (var r = 0; r < rows.length; r++) {
          var clear = rows[r].every(function (o) { return x + w + 6 <= o[0] || o[1] + 6 <= x; });
          if (clear) {
            rows[r].push([x, x + w]);
            v.l.el.setAttribute("x", x.toFixed(1));
            v.l.el.setAttribute("y", 12 + r * ROW_H);
            v.l.el.setAttribute("text-anchor", "start");
            band(v.l, 16 + r * ROW_H);
            return;
          }
        }
      }
      v.l.el.setAttribute("display", "none");
    });
  }

  function render() {
    var k = scale();
    items.forEach(function (it) {
      var e = it[0];
      if (it[1] === 0) {
        e.setAttribute("x", map(it[2]).toFixed(1));
        e.setAttribute("width", (it[3] * k).toFixed(1));
      } else if (it[1] === 1) {
        e.setAttribute("cx", map(it[2]).toFixed(1));
      } else {
        e.setAttribute("d", it[2].replace(/([MH])(-?\d+(?:\.\d+)?)/g, function (m, c, x) {
          return c + map(+x).toFixed(1);
        }));
      }
    });
    ticks();
    layoutLabels();
    var whole = view[0] <= X0 && view[1] >= X0 + W;
    shown.textContent = whole ? "the whole chart" :
      "showing " + ms(view[0]).toFixed(1) + " ms to " + ms(view[1]).toFixed(1) + " ms";
  }

  function zoomTo(a, b) {
    var min = W / MAX_ZOOM;
    if (b - a < min) { var c = (a + b) / 2; a = c - min / 2; b = c + min / 2; }
    if (a < X0) { b += X0 - a; a = X0; }
    if (b > X0 + W) { a -= b - X0 - W; b = X0 + W; }
    view = [Math.max(X0, a), Math.min(X0 + W, b)];
    render();
  }
  function zoomBy(f) {
    var c = (view[0] + view[1]) / 2, h = (view[1] - view[0]) * f / 2;
    zoomTo(c - h, c + h);
  }
  function zoomWindow(n) {
    var l = labels.filter(function (l) { return l.n === n; })[0];
    if (!l) return;
    var m = Math.max((l.x1 - l.x0) * 0.15, 0.5);
    zoomTo(l.x0 - m, l.x1 + m);
  }

  controls.hidden = false;
  svg.setAttribute("class", "zoomable");
  controls.querySelector("[data-zoom=in]").addEventListener("click", function () { zoomBy(0.5); });
  controls.querySelector("[data-zoom=out]").addEventListener("click", function () { zoomBy(2); });
  controls.querySelector("[data-zoom=reset]").addEventListener("click", function () { zoomTo(X0, X0 + W); });
  Array.prototype.forEach.call(document.querySelectorAll("#faults li[data-window]"), function (li) {
    li.addEventListener("click", function () {
      zoomWindow(li.getAttribute("data-window"));
      svg.scrollIntoView({ block: "nearest" });
    });
  });

  var sel = el("rect", { id: "zoom-selection", y: TOP, height: BOTTOM - TOP, fill: "#1565c0",
    "fill-opacity": "0.12", stroke: "#1565c0", display: "none" });
  svg.appendChild(sel);
  var drag = null;
  function svgX(e) {
    var p = svg.createSVGPoint();
    p.x = e.clientX; p.y = e.clientY;
    return p.matrixTransform(svg.getScreenCTM().inverse()).x;
  }
  function clampPlot(x) { return Math.max(X0, Math.min(X0 + W, x)); }
  svg.addEventListener("mousedown", function (e) {
    var x = svgX(e);
    if (e.button !== 0 || x < X0 || x > X0 + W) return;
    drag = x;
    e.preventDefault();
  });
  window.addEventListener("mousemove", function (e) {
    if (drag === null) return;
    var x = clampPlot(svgX(e));
    sel.setAttribute("x", Math.min(x, drag).toFixed(1));
    sel.setAttribute("width", Math.abs(x - drag).toFixed(1));
    sel.removeAttribute("display");
  });
  window.addEventListener("mouseup", function (e) {
    if (drag === null) return;
    var x = clampPlot(svgX(e)), start = drag;
    drag = null;
    sel.setAttribute("display", "none");
    if (Math.abs(x - start) > 4) {
      zoomTo(unmap(Math.min(x, start)), unmap(Math.max(x, start)));
    } else {
      var w = e.target.closest && e.target.closest("[data-window]");
      if (w) zoomWindow(w.getAttribute("data-window"));
    }
  });

  svg.addEventListener("mousemove", function (e) {
    var t = drag === null && e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!t) { tip.hidden = true; return; }
    tip.textContent = t.getAttribute("data-tip");
    tip.hidden = false;
    var left = e.clientX + 14, top = e.clientY + 14;
    if (left + tip.offsetWidth > window.innerWidth - 4) left = Math.max(4, e.clientX - tip.offsetWidth - 14);
    if (top + tip.offsetHeight > window.innerHeight - 4) top = Math.max(4, e.clientY - tip.offsetHeight - 14);
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  });
  svg.addEventListener("mouseleave", function () { tip.hidden = true; });
  render();
})();
