/* Attention complexity scaling: lab 10's methods against sequence length N
 * (traces/complexity-reference.js): pairs scored from the lab's masks and buckets, modelled
 * FLOPs and bytes, and each method's error on the lab's retrieval task. Playback only. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("complexity-viz");
  const ref = V.trace("complexity-reference");
  // measured sizes (the lab's functions ran), then modelled ones (costs only) to ~10^6
  const measured = ref.inputs.sizes, sizes = measured.concat(ref.inputs.model_sizes);
  const byName = {}, modelled = {};
  ref.methods.forEach(function (m) { byName[m.name] = m; });
  ref.modelled.forEach(function (m) { modelled[m.name] = m; });
  const names = ref.methods.map(function (m) { return m.name; });
  const COLORS = ["#222", "#888", "#4e79a7", "#76b7b2", "#59a14f", "#8cd17d", "#f28e2b", "#e15759", "#b07aa1", "#ff9da7"];
  const METRICS = [["flops", "FLOPs (modelled)"], ["bytes", "largest intermediate, bytes (modelled)"],
    ["error", "retrieval row: relative error"], ["rms", "all rows: RMS error"]];
  const state = { metric: "flops", k: measured.length - 1 };
  /* metric of method nm at size index i: the measured trace, then the modelled one */
  function at(nm, metric, i) {
    if (i < measured.length) return byName[nm][metric][i];
    return metric === "error" || metric === "rms" ? null : modelled[nm][metric][i - measured.length];
  }
  /* 10^e as a tick label: SI prefixes, never e-notation */
  function si(e, unit) {
    const pre = ["", " k", " M", " G", " T", " P", " E", " Z"][Math.floor(e / 3)];
    return String(Math.pow(10, e % 3)) + (pre || "") + (unit ? (pre ? "" : " ") + unit : "");
  }
  function nLabel(n) {
    if (n % 1048576 === 0) return (n / 1048576) + "M";
    if (n % 1024 === 0) return (n / 1024) + "K";
    return n >= 1e6 ? (n / 1e6).toFixed(2) + "M" : V.count(n);
  }

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
    nOut.textContent = " " + V.count(sizes[state.k]) + (state.k >= measured.length ? " (modelled) " : " ");
    root.setAttribute("data-metric", metric);
    root.setAttribute("data-n", String(sizes[state.k]));
    V.clear(svg);
    const x0 = 60, y0 = 56, w = 330, h = 200;
    const last = log ? sizes.length : measured.length;  // errors exist only where the lab ran
    let vals = [];
    names.forEach(function (nm) {
      for (let i = 0; i < last; i++) { const v = at(nm, metric, i); if (typeof v === "number" && (!log || v > 0)) vals.push(v); }
    });
    const eLo = log ? Math.floor(Math.log10(Math.min.apply(null, vals))) : 0;
    const eHi = log ? Math.ceil(Math.log10(Math.max.apply(null, vals))) : 0;
    const hi = log ? 0 : Math.max.apply(null, vals);
    const lx0 = Math.log2(sizes[0]), lx1 = Math.log2(sizes[sizes.length - 1]);
    function pxn(n) { return x0 + w * (Math.log2(n) - lx0) / (lx1 - lx0); }
    function px(i) { return pxn(sizes[i]); }
    function py(v) {
      if (log) return y0 + h - h * (Math.log10(v) - eLo) / (eHi - eLo || 1);
      return y0 + h - h * v / (hi || 1);
    }
    V.s("text", { x: 10, y: 16, class: "title" }, svg, METRICS.find(function (m) { return m[0] === metric; })[1] +
      (log ? ", log scale; dashed: modelled beyond N = " + V.count(measured[measured.length - 1]) : ""));
    V.s("line", { x1: x0, x2: x0 + w, y1: y0 + h, y2: y0 + h, stroke: "#999" }, svg);
    V.s("line", { x1: x0, x2: x0, y1: y0, y2: y0 + h, stroke: "#999" }, svg);
    // y ticks: every decade (costs, labelled every third when crowded), or 0 / max (errors)
    if (log) {
      const every = eHi - eLo > 8 ? 3 : eHi - eLo > 4 ? 2 : 1;
      for (let e = eLo; e <= eHi; e++) {
        V.s("line", { x1: x0 - 3, x2: x0 + w, y1: py(Math.pow(10, e)), y2: py(Math.pow(10, e)), stroke: "#eee" }, svg);
        if ((e - eLo) % every === 0) V.s("text", { x: x0 - 5, y: py(Math.pow(10, e)) + 4, "text-anchor": "end",
          class: "y-tick" }, svg, si(e, metric === "bytes" ? "B" : ""));
      }
    } else {
      V.s("text", { x: x0 - 5, y: y0 + 4, "text-anchor": "end", class: "y-tick" }, svg, hi.toFixed(2));
      V.s("text", { x: x0 - 5, y: y0 + h + 4, "text-anchor": "end", class: "y-tick" }, svg, "0");
    }
    // x ticks: every other doubling
    sizes.forEach(function (n, i) {
      if (i % 2 === 0) V.s("text", { x: px(i), y: y0 + h + 19, "text-anchor": "middle" }, svg, nLabel(n));
    });
    V.s("text", { x: x0 + w, y: y0 + h + 33, "text-anchor": "end" }, svg, "N (tokens, log scale)");
    // real models' context lengths
    ref.inputs.contexts.forEach(function (cx, i) {
      const x = pxn(cx[1]);
      V.s("line", { x1: x, x2: x, y1: y0 - 4, y2: y0 + h, stroke: "#b07aa1", "stroke-dasharray": "2 3" }, svg);
      V.s("text", { x: x, y: y0 - 8 - (i % 2) * 15, "text-anchor": i === ref.inputs.contexts.length - 1 ? "end" : "middle",
        class: "context-mark", "data-n": cx[1] }, svg, cx[0] + " " + nLabel(cx[1]));
    });
    V.s("line", { x1: px(state.k), x2: px(state.k), y1: y0, y2: y0 + h, stroke: "#f28e2b", "stroke-width": 2 }, svg);
    names.forEach(function (nm, c) {
      [[0, measured.length], [measured.length - 1, last]].forEach(function (range, part) {
        const pts = [];
        for (let i = range[0]; i < range[1]; i++) {
          const v = at(nm, metric, i);
          if (typeof v === "number" && (!log || v > 0)) pts.push(px(i) + "," + py(v));
        }
        if (pts.length > 1) V.s("polyline", { points: pts.join(" "), fill: "none", stroke: COLORS[c], "stroke-width": 2,
          "stroke-dasharray": part ? "5 3" : null }, svg);
      });
      const v = at(nm, metric, state.k);
      if (typeof v === "number" && (!log || v > 0)) V.s("circle", { cx: px(state.k), cy: py(v), r: 4, fill: COLORS[c] }, svg);
    });
    V.legend(svg, 10, y0 + h + 40, names.map(function (nm, c) { return { color: COLORS[c], label: nm }; }), 400);
    V.clear(side);
    side.appendChild(V.h("h4", {}, "N = " + V.count(sizes[state.k])));
    const scroll = V.h("div", { class: "viz-wide" }); // six columns: scrolls sideways on a phone
    side.appendChild(scroll);
    const run = state.k < measured.length;
    scroll.appendChild(V.table(["method", "pairs", "FLOPs", "bytes", "error", "RMS"], names.map(function (nm) {
      const k = state.k, slug = nm.replace(/[^a-z0-9]+/gi, "-").toLowerCase();
      function cell(metric, nd) {
        if (!run && (metric === "error" || metric === "rms")) return "not run";
        const el = V.num(at(nm, metric, k), nd, { id: "complexity-" + metric + "-" + slug });
        return metric === "error" || metric === "rms" ? small(el) : el;
      }
      return { attrs: { "data-method": nm }, cells: [nm, V.num(at(nm, "pairs", k), 0), cell("flops", 0), cell("bytes", 0),
        cell("error", 3), cell("rms", 3)] };
    }), { id: "complexity-table" }));
    if (!run) side.appendChild(V.h("p", { id: "complexity-modelled" }, "Modelled, not run: at this N the lab's functions " +
      "would need an N × N mask. Exact attention's score matrix alone is " + V.bytes(at("exact", "bytes", state.k)) +
      "; the sparse patterns' pairs continue the line through N = " +
      V.count(measured[measured.length - 2]) + " and " + V.count(measured[measured.length - 1]) + "."));
    side.appendChild(V.h("p", {}, "Exact attention's cost grows with N²; the approximations grow with N. But on the retrieval task (the last " +
      "query must find one key planted far back) the patterns that never score that pair miss it entirely (error near 1 or above), while " +
      "LSH, which hashes the query and its key together, finds it. Chunked attention is exact with a small block of scores alive: " +
      "the idea FlashAttention made fast."));
  }
  render();
})();
