/* Attention complexity scaling: lab 10's methods against sequence length N
 * (traces/complexity-reference.js): pairs scored from the lab's masks and buckets, modelled
 * FLOPs and bytes, and each method's error on the lab's retrieval task. Playback only. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("complexity-viz");
  const ref = V.trace("complexity-reference");
  const sizes = ref.inputs.sizes;
  const byName = {};
  ref.methods.forEach(function (m) { byName[m.name] = m; });
  const names = ref.methods.map(function (m) { return m.name; });
  const COLORS = ["#222", "#888", "#4e79a7", "#76b7b2", "#59a14f", "#8cd17d", "#f28e2b", "#e15759", "#b07aa1", "#ff9da7"];
  const METRICS = [["flops", "FLOPs (modelled)"], ["bytes", "largest intermediate, bytes (modelled)"],
    ["error", "retrieval row: relative error"], ["rms", "all rows: RMS error"]];
  const state = { metric: "flops", k: sizes.length - 1 };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  const sel = V.h("select", { id: "complexity-metric", "aria-label": "what to plot" });
  METRICS.forEach(function (m) { sel.appendChild(V.h("option", { value: m[0] }, m[1])); });
  sel.addEventListener("change", function () { state.metric = sel.value; render(); });
  toolbar.appendChild(V.h("label", { for: "complexity-metric" }, ["Plot ", sel]));
  const { input: nIn, output: nOut } = V.slider(toolbar, { id: "complexity-n", text: "N ",
    min: 0, max: sizes.length - 1, value: state.k, label: "sequence length N" },
    function () { state.k = Number(nIn.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to a control; ↑ / ↓ choose what to plot, ← / → choose N."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 420",
    "each method's cost or error against the sequence length");

  /* a tiny error (LSH's 1e-9) in powers of ten rather than 0.000 */
  function small(el) {
    const v = JSON.parse(el.getAttribute("data-value"));
    if (typeof v === "number" && v > 0 && v < 0.001) el.textContent = v.toExponential(1);
    return el;
  }

  function render() {
    const metric = state.metric, log = metric === "flops" || metric === "bytes";
    nOut.textContent = " " + V.count(sizes[state.k]) + " ";
    root.setAttribute("data-metric", metric);
    root.setAttribute("data-n", String(sizes[state.k]));
    V.clear(svg);
    const x0 = 60, y0 = 30, w = 330, h = 220;
    let vals = [];
    names.forEach(function (nm) { byName[nm][metric].forEach(function (v) { if (typeof v === "number" && (!log || v > 0)) vals.push(v); }); });
    const lo = log ? Math.min.apply(null, vals) : 0, hi = Math.max.apply(null, vals);
    function px(i) { return x0 + i * w / (sizes.length - 1); }
    function py(v) {
      if (log) return y0 + h - h * (Math.log(v) - Math.log(lo)) / (Math.log(hi) - Math.log(lo) || 1);
      return y0 + h - h * v / (hi || 1);
    }
    V.s("text", { x: 10, y: 16, class: "title" }, svg, METRICS.find(function (m) { return m[0] === metric; })[1] + (log ? ", log scale" : ""));
    V.s("line", { x1: x0, x2: x0 + w, y1: y0 + h, y2: y0 + h, stroke: "#999" }, svg);
    V.s("line", { x1: x0, x2: x0, y1: y0, y2: y0 + h, stroke: "#999" }, svg);
    V.s("text", { x: 4, y: y0 + 8 }, svg, log ? hi.toExponential(1) : hi.toFixed(2));
    V.s("text", { x: 4, y: y0 + h }, svg, log ? lo.toExponential(1) : "0");
    sizes.forEach(function (n, i) { V.s("text", { x: px(i) - 12, y: y0 + h + 14 }, svg, String(n)); });
    V.s("line", { x1: px(state.k), x2: px(state.k), y1: y0, y2: y0 + h, stroke: "#f28e2b" }, svg);
    names.forEach(function (nm, c) {
      const ys = byName[nm][metric];
      const pts = [];
      ys.forEach(function (v, i) { if (typeof v === "number" && (!log || v > 0)) pts.push(px(i) + "," + py(v)); });
      if (pts.length > 1) V.s("polyline", { points: pts.join(" "), fill: "none", stroke: COLORS[c], "stroke-width": 2 }, svg);
      ys.forEach(function (v, i) {
        if (typeof v === "number" && (!log || v > 0)) V.s("circle", { cx: px(i), cy: py(v), r: i === state.k ? 4 : 2.5, fill: COLORS[c] }, svg);
      });
    });
    V.legend(svg, 10, y0 + h + 30, names.map(function (nm, c) { return { color: COLORS[c], label: nm }; }), 400);
    V.clear(side);
    side.appendChild(V.h("h4", {}, "N = " + V.count(sizes[state.k])));
    const scroll = V.h("div", { class: "viz-wide" }); // six columns: scrolls sideways on a phone
    side.appendChild(scroll);
    scroll.appendChild(V.table(["method", "pairs", "FLOPs", "bytes", "error", "RMS"], names.map(function (nm, c) {
      const m = byName[nm], k = state.k, slug = nm.replace(/[^a-z0-9]+/gi, "-").toLowerCase();
      return { attrs: { "data-method": nm }, cells: [nm, V.num(m.pairs[k], 0), V.num(m.flops[k], 0, { id: "complexity-flops-" + slug }),
        V.num(m.bytes[k], 0, { id: "complexity-bytes-" + slug }), small(V.num(m.error[k], 3, { id: "complexity-error-" + slug })),
        small(V.num(m.rms[k], 3, { id: "complexity-rms-" + slug }))] };
    }), { id: "complexity-table" }));
    side.appendChild(V.h("p", {}, "Exact attention's cost grows with N²; the approximations grow with N. But on the retrieval task (the last " +
      "query must find one key planted far back) the patterns that never score that pair miss it entirely (error near 1 or above), while " +
      "LSH, which hashes the query and its key together, finds it. Chunked attention is exact with a small block of scores alive: " +
      "the idea FlashAttention made fast."));
  }
  render();
})();
