/* Shared helpers of the book's visualisations: DOM and SVG builders, number formatting,
 * the Play / Pause / Step player with keyboard controls and reduced motion, and the
 * "your code" panel. Plain script (no modules, no bundler): pages also work from file://.
 * Nothing here computes what a lab computes: pages only play back traces written by
 * `python -m book.traces` (the reference) and `make trace LAB=nn` (your starter). */
(function () {
  "use strict";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const V = (window.Viz = {});

  V.reducedMotion = function () {
    return !!(window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches);
  };
  V.trace = function (name) {
    const all = window.BOOK_TRACES || {};
    return Object.prototype.hasOwnProperty.call(all, name) ? all[name] : undefined;
  };

  V.fmt = function (x, nd) {
    nd = nd === undefined ? 4 : nd;
    if (x === null || x === undefined) return "—";
    if (typeof x === "string") return x === "-inf" ? "−∞" : x === "inf" ? "∞" : x;
    if (Array.isArray(x)) return "[" + x.map(function (v) { return V.fmt(v, nd); }).join(", ") + "]";
    return Number(x).toFixed(nd);
  };
  /* any traced value: integers as integers, floats to 4 places, lists and records */
  V.fmtAny = function (x) {
    if (x === null || x === undefined || typeof x === "string") return V.fmt(x);
    if (Array.isArray(x)) return "[" + x.map(V.fmtAny).join(", ") + "]";
    if (typeof x === "object") {
      return "{" + Object.keys(x).map(function (k) { return k + ": " + V.fmtAny(x[k]); }).join(", ") + "}";
    }
    return Number.isInteger(x) ? String(x) : Number(x).toFixed(4);
  };
  V.bytes = function (n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
  };
  V.count = function (n) { return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"); };

  /* html element: V.h("div", {class: "x"}, "text" | [children]) */
  V.h = function (tag, attrs, content) {
    const el = document.createElement(tag);
    V.attrs(el, attrs);
    V.fill(el, content);
    return el;
  };
  /* svg element, appended to parent when given */
  V.s = function (tag, attrs, parent, text) {
    const el = document.createElementNS(SVG_NS, tag);
    V.attrs(el, attrs);
    if (text !== undefined) el.textContent = text;
    if (parent) parent.appendChild(el);
    return el;
  };
  V.attrs = function (el, attrs) {
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] !== undefined && attrs[k] !== null && attrs[k] !== false) el.setAttribute(k, attrs[k]);
    });
    return el;
  };
  V.fill = function (el, content) {
    if (content === undefined || content === null) return el;
    (Array.isArray(content) ? content : [content]).forEach(function (c) {
      el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
    return el;
  };
  V.clear = function (el) { while (el.firstChild) el.removeChild(el.firstChild); return el; };

  /* a labelled range slider in toolbar: <label>text <output id="ID-label"> <input id="ID"></label>;
     onInput runs on every move; returns {input, output} */
  V.slider = function (toolbar, opts, onInput) {
    const input = V.h("input", { type: "range", id: opts.id, min: opts.min, max: opts.max, step: 1,
      value: opts.value, "aria-label": opts.label });
    const output = V.h("output", { id: opts.id + "-label", for: opts.id });
    input.addEventListener("input", onInput);
    toolbar.appendChild(V.h("label", { for: opts.id }, [opts.text, output, input]));
    return { input: input, output: output };
  };

  /* the page's two panes under root: the figure (an svg of viewBox, described by label) and
     the side column for numbers; returns {svg, side} */
  V.panes = function (root, viewBox, label) {
    const main = V.h("div", { class: "viz-main" });
    const svg = V.s("svg", { class: "viz-svg", viewBox: viewBox, role: "img", "aria-label": label }, main);
    const side = V.h("div", { class: "viz-side" });
    main.appendChild(side);
    root.appendChild(main);
    return { svg: svg, side: side };
  };

  /* a number shown in the page, with the trace's exact value in data-value for tests */
  V.num = function (value, nd, attrs) {
    const el = V.h("span", Object.assign({ class: "num", "data-value": JSON.stringify(value) }, attrs || {}),
      V.fmt(value, nd));
    return el;
  };

  /* a legend drawn on the SVG canvas: items [{color, label, stroke?}] in rows */
  V.legend = function (svg, x, y, items, width) {
    const g = V.s("g", { class: "legend", transform: "translate(" + x + "," + y + ")" }, svg);
    let cx = 0, cy = 0;
    width = width || 500;
    items.forEach(function (it) {
      const w = 22 + it.label.length * 6.4;
      if (cx + w > width) { cx = 0; cy += 18; }
      V.s("rect", { x: cx, y: cy, width: 12, height: 12, rx: 2, fill: it.color,
        stroke: it.stroke || "#555", "stroke-width": it.stroke ? 2 : 0.5,
        "stroke-dasharray": it.dash || null }, g);
      V.s("text", { x: cx + 16, y: cy + 10, class: "legend-label" }, g, it.label);
      cx += w + 10;
    });
    return g;
  };

  /* arrow marker definitions, once per svg */
  V.arrowDefs = function (svg, id, color) {
    const defs = V.s("defs", {}, svg);
    const m = V.s("marker", { id: id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6,
      markerHeight: 6, orient: "auto-start-reverse" }, defs);
    V.s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: color }, m);
    return defs;
  };

  /* Player: Play / Pause / Step / Back / Reset / End / speed, and keys. */
  V.Player = function (root, opts) {
    this.root = root;
    this.steps = opts.steps;
    this.render = opts.render;
    this.step = 0;
    this.speed = 1;
    this.timer = null;
    this.name = opts.name || "viz";
    const self = this;
    const bar = V.h("div", { class: "viz-controls", role: "group", "aria-label": "animation controls" });
    function btn(label, title, key, fn) {
      const b = V.h("button", { type: "button", title: title + " (" + key + ")", "data-action": label.toLowerCase() },
        label);
      b.addEventListener("click", fn);
      bar.appendChild(b);
      return b;
    }
    btn("Reset", "first step", "Home", function () { self.go(0); });
    btn("Back", "previous step", "←", function () { self.go(self.step - 1); });
    this.playBtn = btn("Play", "play / pause", "Space", function () { self.toggle(); });
    btn("Step", "next step", "→", function () { self.go(self.step + 1); });
    btn("End", "last step", "End", function () { self.go(self.steps - 1); });
    const speed = V.h("select", { "aria-label": "speed", title: "speed (+ / −)" });
    [0.5, 1, 2, 4].forEach(function (s) {
      const o = V.h("option", { value: s }, s + "×");
      if (s === 1) o.selected = true;
      speed.appendChild(o);
    });
    speed.addEventListener("change", function () { self.speed = Number(speed.value); self.restart(); });
    this.speedSel = speed;
    bar.appendChild(speed);
    this.label = V.h("span", { class: "viz-step", "aria-live": "polite" });
    bar.appendChild(this.label);
    this.bar = bar;
    root.setAttribute("tabindex", "0");
    root.addEventListener("keydown", function (e) { self.key(e); });
    if (V.reducedMotion()) root.classList.add("reduced-motion");
    V.players.push(this);
  };
  V.players = [];
  V.Player.prototype.key = function (e) {
    if (e.target && /^(INPUT|SELECT|TEXTAREA)$/.test(e.target.tagName) && e.target.type !== "radio") return;
    const k = e.key;
    if (k === " " || k === "k") this.toggle();
    else if (k === "ArrowRight" || k === "l") this.go(this.step + 1);
    else if (k === "ArrowLeft" || k === "j") this.go(this.step - 1);
    else if (k === "Home") this.go(0);
    else if (k === "End") this.go(this.steps - 1);
    else if (k === "+" || k === "=") this.setSpeed(1);
    else if (k === "-") this.setSpeed(-1);
    else return;
    e.preventDefault();
    e.stopPropagation();
  };
  V.Player.prototype.setSpeed = function (dir) {
    const i = Math.max(0, Math.min(this.speedSel.options.length - 1, this.speedSel.selectedIndex + dir));
    this.speedSel.selectedIndex = i;
    this.speed = Number(this.speedSel.value);
    this.restart();
  };
  V.Player.prototype.go = function (k) {
    this.step = Math.max(0, Math.min(this.steps - 1, k));
    this.root.setAttribute("data-step", String(this.step));
    this.label.textContent = "Step " + (this.step + 1) + " / " + this.steps;
    this.render(this.step);
    if (this.step >= this.steps - 1) this.pause();
  };
  V.Player.prototype.reset = function (steps) {
    this.pause();
    this.steps = steps;
    this.go(0);
  };
  V.Player.prototype.toggle = function () { if (this.timer) this.pause(); else this.play(); };
  V.Player.prototype.play = function () {
    const self = this;
    if (this.step >= this.steps - 1) this.go(0);
    this.playBtn.textContent = "Pause";
    this.root.setAttribute("data-playing", "true");
    clearInterval(this.timer);
    this.timer = setInterval(function () { self.go(self.step + 1); }, 1400 / this.speed);
  };
  V.Player.prototype.pause = function () {
    clearInterval(this.timer);
    this.timer = null;
    if (this.playBtn) this.playBtn.textContent = "Play";
    this.root.setAttribute("data-playing", "false");
  };
  V.Player.prototype.restart = function () { if (this.timer) { this.pause(); this.play(); } };

  /* keys pressed outside any visualisation drive the page's first player */
  document.addEventListener("keydown", function (e) {
    const a = document.activeElement;
    if (!V.players.length || (a && a !== document.body && a.closest && a.closest(".viz"))) return;
    if (a && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (["ArrowRight", "ArrowLeft", " ", "Home", "End"].indexOf(e.key) >= 0) V.players[0].key(e);
  });

  /* The "your code" panel: what `make trace LAB=nn` found. Returns the first difference. */
  V.starterPanel = function (parent, lab, starter, goTo) {
    const box = V.h("div", { class: "viz-starter", id: "starter-" + lab, "aria-live": "polite" });
    box.appendChild(V.h("h4", {}, "Your code"));
    let diff = null;
    if (starter === null || starter === undefined) {
      box.setAttribute("data-state", "none");
      box.appendChild(V.h("p", {}, ["No trace of your starter.py yet: run ",
        V.h("code", {}, "make trace LAB=" + lab), " and reload this page."]));
    } else if (!starter.first_diff) {
      box.setAttribute("data-state", "match");
      box.appendChild(V.h("p", { class: "ok" }, "Your starter.py matches the reference at every step shown here."));
    } else {
      diff = starter.first_diff;
      box.setAttribute("data-state", "differs");
      box.setAttribute("data-first-diff", String(diff.step));
      const errs = starter.errors || (starter.import_error ? [starter.import_error] : []);
      box.appendChild(V.h("p", { class: "bad" }, [
        "First difference at step " + (diff.step + 1) + " (" + diff.where + "): ",
        V.h("code", {}, diff.field)]));
      if (diff.field !== "import") {
        box.appendChild(V.h("p", {}, ["yours ", V.h("code", { class: "num", "data-value": JSON.stringify(diff.yours) },
          V.fmtAny(diff.yours)), " · reference ", V.h("code", { class: "num", "data-value": JSON.stringify(diff.reference) },
          V.fmtAny(diff.reference))]));
      }
      if (errs.length) box.appendChild(V.h("p", { class: "err" }, ["Your code raised: ", V.h("code", {}, errs[0])]));
      const b = V.h("button", { type: "button", "data-action": "goto-diff" }, "Show that step");
      b.addEventListener("click", function () { goTo(diff.step); });
      box.appendChild(b);
    }
    parent.appendChild(box);
    return diff;
  };

  /* Every visualisation gets "Full screen" and "Open in a new tab" buttons. The new tab is
     this page with ?viz=<id>: that visualisation alone (html.viz-solo in viz.css). */
  V.frame = function (root) {
    if (!root.id || root.querySelector(":scope > .viz-frame")) return;
    const bar = V.h("div", { class: "viz-frame" });
    const full = V.h("button", { type: "button", "data-action": "fullscreen", title: "show this visualisation full screen" },
      "Full screen");
    full.addEventListener("click", function () {
      if (document.fullscreenElement === root) document.exitFullscreen();
      else if (root.requestFullscreen) root.requestFullscreen();
    });
    document.addEventListener("fullscreenchange", function () {
      const on = document.fullscreenElement === root;
      full.textContent = on ? "Exit full screen" : "Full screen";
      root.setAttribute("data-fullscreen", on ? "true" : "false");
    });
    const url = location.href.split("#")[0].split("?")[0] + "?viz=" + encodeURIComponent(root.id);
    const tab = V.h("a", { href: url, target: "_blank", rel: "noopener", "data-action": "new-tab",
      title: "open this visualisation alone in a new tab" }, "Open in a new tab");
    bar.appendChild(full);
    bar.appendChild(tab);
    root.insertBefore(bar, root.firstChild);
  };
  function frames() {
    document.querySelectorAll(".viz[id]").forEach(V.frame);
    const solo = new URLSearchParams(location.search).get("viz");
    const target = solo && document.getElementById(solo);
    if (target) {
      document.documentElement.classList.add("viz-solo");
      let el = target;  // the visualisation and the blocks that hold it stay visible
      while (el && el.parentElement && !el.parentElement.classList.contains("md-content__inner")) el = el.parentElement;
      if (el) el.classList.add("viz-solo-target");
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", frames);
  else frames();

  V.table = function (headers, rows, attrs) {
    const t = V.h("table", Object.assign({ class: "viz-table" }, attrs || {}));
    const thead = V.h("thead");
    thead.appendChild(V.h("tr", {}, headers.map(function (h) { return V.h("th", { scope: "col" }, h); })));
    t.appendChild(thead);
    const tb = V.h("tbody");
    rows.forEach(function (r) {
      const tr = V.h("tr", r.attrs || {});
      r.cells.forEach(function (c) { tr.appendChild(V.h("td", {}, c)); });
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    return t;
  };
})();
