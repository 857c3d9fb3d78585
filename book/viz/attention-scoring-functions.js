/* Attention scoring functions: plays back lab 08's trace (traces/lab08-reference.js): per
 * head dim d_k, scale_experiment's variance and mean entropy, and one query against 8 keys
 * scored by additive_scores, dot_scores and scaled_dot_scores, with softmax and
 * softmax_entropy. Your starter's run (make trace LAB=08) when there is one. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("scoring-viz");
  const ref = V.trace("lab08-reference");
  const starter = V.trace("lab08-starter");
  // this page's own first difference (the trace also feeds the multi-head page)
  const mine = starter && starter.page_diffs ? Object.assign({}, starter, { first_diff: starter.page_diffs.scoring }) : starter;
  const FNS = [["additive", "additive", "#59a14f"], ["dot", "dot", "#e15759"], ["scaled_dot", "scaled dot", "#4e79a7"]];
  const dims = ref.steps.map(function (s) { return s.d; });
  const state = { k: dims.indexOf(64) >= 0 ? dims.indexOf(64) : 0 };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  const { input: slider, output: dOut } = V.slider(toolbar, { id: "scoring-d", text: "d_k ",
    min: 0, max: dims.length - 1, value: state.k, label: "head dimension d_k (powers of two)" },
    function () { state.k = Number(slider.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to the slider, then ← / → (Home / End)."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 400",
    "softmax weights of one query over 8 keys for three scoring functions, and entropy against d_k");
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  const diff = V.starterPanel(wide, "08", mine, function (k) { slider.value = k; state.k = k; render(); });

  function weightBars(y0, fn, ex, color) {
    const n = ex.weights ? ex.weights.length : ref.inputs.num_keys;
    V.s("text", { x: 10, y: y0 + 12 }, svg, fn[1]);
    V.s("line", { x1: 84, x2: 84 + n * 30, y1: y0 + 50, y2: y0 + 50, stroke: "#999" }, svg);
    for (let j = 0; j < n; j++) {
      const w = ex.weights ? ex.weights[j] : 0;
      const h = 46 * (typeof w === "number" ? w : 0);
      V.s("rect", { x: 86 + j * 30, y: y0 + 50 - h, width: 24, height: Math.max(h, 0.5), fill: color,
        id: "scoring-bar-" + fn[0] + "-" + j, "data-value": JSON.stringify(w) }, svg);
    }
    V.s("text", { x: 86 + n * 30 + 4, y: y0 + 30 }, svg, "H = " + V.fmt(ex.entropy, 2));
  }

  function entropyChart(y0) {
    const x0 = 60, w = 300, h = 90, max = ref.max_entropy;
    V.s("text", { x: 10, y: y0 - 12, class: "title" }, svg, "scale_experiment: mean entropy (nats) against d_k");
    V.s("line", { x1: x0, x2: x0 + w, y1: y0 + h, y2: y0 + h, stroke: "#999" }, svg);
    V.s("line", { x1: x0, x2: x0, y1: y0, y2: y0 + h, stroke: "#999" }, svg);
    V.s("line", { x1: x0, x2: x0 + w, y1: y0, y2: y0, stroke: "#bbb", "stroke-dasharray": "3 3" }, svg);
    V.s("text", { x: 8, y: y0 + 4 }, svg, "log 256");
    V.s("text", { x: 40, y: y0 + h + 4 }, svg, "0");
    function px(i) { return x0 + i * w / (dims.length - 1); }
    function py(v) { return y0 + h - h * (typeof v === "number" ? v : 0) / max; }
    [["entropy_unscaled", "#e15759"], ["entropy_scaled", "#4e79a7"]].forEach(function (c) {
      const pts = ref.steps.map(function (s, i) { return px(i) + "," + py(s.stats[c[0]]); }).join(" ");
      V.s("polyline", { points: pts, fill: "none", stroke: c[1], "stroke-width": 2 }, svg);
      V.s("circle", { cx: px(state.k), cy: py(ref.steps[state.k].stats[c[0]]), r: 4, fill: c[1] }, svg);
    });
    dims.forEach(function (d, i) {
      if (i % 2 === 0 || i === dims.length - 1) V.s("text", { x: px(i) - 6, y: y0 + h + 14 }, svg, String(d));
    });
    V.s("line", { x1: px(state.k), x2: px(state.k), y1: y0, y2: y0 + h, stroke: "#f28e2b" }, svg);
  }

  function render() {
    const st = ref.steps[state.k];
    dOut.textContent = " " + st.d + " ";
    root.setAttribute("data-d", String(st.d));
    V.clear(svg);
    V.s("text", { x: 10, y: 16, class: "title" }, svg, "One query, 8 keys, d_k = " + st.d + ": softmax weights");
    FNS.forEach(function (fn, i) { weightBars(26 + i * 62, fn, st.example[fn[0]], fn[2]); });
    entropyChart(236);
    V.legend(svg, 10, 356, [{ color: "#59a14f", label: "additive v·tanh(qW + kW)" }, { color: "#e15759", label: "dot q·k (unscaled)" },
      { color: "#4e79a7", label: "scaled dot q·k/√d_k" }, { color: "#f28e2b", label: "this d_k" }], 400);
    V.clear(side);
    side.appendChild(V.h("h4", {}, "scale_experiment(" + st.d + "): 256 × 256 scores"));
    const dl = V.h("dl", { class: "viz-counters" });
    [["variance, q·k", V.num(st.stats.variance_unscaled, 3, { id: "scoring-var-unscaled" })],
      ["variance, q·k/√d_k", V.num(st.stats.variance_scaled, 3, { id: "scoring-var-scaled" })],
      ["mean entropy, q·k", V.num(st.stats.entropy_unscaled, 3, { id: "scoring-ent-unscaled" })],
      ["mean entropy, q·k/√d_k", V.num(st.stats.entropy_scaled, 3, { id: "scoring-ent-scaled" })],
      ["largest possible (log 256)", V.num(ref.max_entropy, 3)]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("h4", {}, "The example query (8 keys, log 8 = " + V.fmt(ref.max_entropy_example, 3) + ")"));
    side.appendChild(V.table(["score", "entropy", "scores"], FNS.map(function (fn) {
      const ex = st.example[fn[0]];
      const bad = diff && diff.step === state.k && diff.field.indexOf(fn[0] + " ") === 0;
      return { attrs: { class: bad ? "differs" : "", "data-fn": fn[0] }, cells: [fn[1],
        V.num(ex.entropy, 3, { id: "scoring-ent-" + fn[0] }), V.num(ex.scores, 2, { id: "scoring-scores-" + fn[0] })] };
    }), { id: "scoring-table" }));
    side.appendChild(V.h("p", {}, st.stats.variance_unscaled > 4
      ? "Unscaled, the scores spread like √d_k, so the largest one wins nearly all the weight: a softmax this peaked passes almost no gradient to the other keys."
      : "At small d_k the raw and the scaled scores are close; the difference grows with d_k."));
  }
  render();
})();
