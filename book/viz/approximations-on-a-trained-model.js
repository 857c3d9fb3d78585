/* Lab 10's approximations on a trained model's own q, k, v (traces/adder-approx-reference.js,
 * written by `python -m book.approximation_trace`): per head, the softmax matrix's singular
 * values (lab 10's attention_singular_values) beside random and retrieval-task vectors, and
 * each method's error on the rows that predict answer digits. Playback only. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("approx-viz");
  const ref = V.trace("adder-approx-reference");
  if (!root || !ref) return;
  // open on the head whose spectrum is flattest (most singular values for 90 % of the energy)
  let start = 0;
  ref.spectrum.forEach(function (s, i) { if (s.rank90 > ref.spectrum[start].rank90) start = i; });
  const state = { head: start };
  const toolbar = V.h("div", { class: "viz-toolbar" });
  const sel = V.h("select", { id: "approx-head", "aria-label": "Layer and head" });
  ref.spectrum.forEach(function (s, i) { sel.appendChild(V.h("option", { value: i }, "layer " + s.layer + ", head " + s.head)); });
  sel.value = String(state.head);
  sel.addEventListener("change", function () { state.head = Number(sel.value); render(); });
  toolbar.appendChild(V.h("label", { for: "approx-head" }, ["Head ", sel]));
  root.appendChild(toolbar);
  const { svg, side } = V.panes(root, "0 0 440 300",
    "singular values of the softmax matrix: this head, random vectors, lab 10's retrieval task");
  const colors = { head: "#4e79a7", random: "#8c8c8c", task: "#e15759" };

  function err(v, id) { // tiny errors (rounding, a perfect hash) in scientific notation, not "0.000"
    const el = V.num(v, 3, { id: id });
    if (typeof v === "number" && v !== 0 && Math.abs(v) < 1e-3) el.textContent = v.toExponential(1).replace("e", "×10^");
    return el;
  }

  function render() {
    const sp = ref.spectrum[state.head], rt = ref.retrieval[state.head], syn = ref.synthetic;
    root.setAttribute("data-view", String(state.head));
    V.clear(svg);
    V.s("text", { x: 8, y: 16, class: "title" }, svg, "σ_i / σ_1 of softmax(q kᵀ/√d), N = " + ref.seq_len + ", d = " + ref.head_dim);
    const x0 = 40, y0 = 34, w = 380, hgt = 170, n = sp.sv.length, bw = w / n;
    [0, 0.5, 1].forEach(function (t) {
      const y = y0 + hgt * (1 - t);
      V.s("line", { x1: x0, x2: x0 + w, y1: y, y2: y, stroke: "#ddd" }, svg);
      V.s("text", { x: x0 - 6, y: y + 4, "text-anchor": "end" }, svg, String(t));
    });
    [["head", sp.sv], ["random", syn.random_sv], ["task", syn.task_sv]].forEach(function (series, s) {
      series[1].forEach(function (v, i) {
        V.s("rect", { x: x0 + i * bw + s * (bw / 3.2) + 1, y: y0 + hgt * (1 - v), width: bw / 3.4, height: hgt * v,
          fill: colors[series[0]], id: "approx-sv-" + series[0] + "-" + i, "data-value": JSON.stringify(v) }, svg);
      });
    });
    for (let i = 0; i < n; i += 2) V.s("text", { x: x0 + i * bw + bw / 2, y: y0 + hgt + 14, "text-anchor": "middle" }, svg, String(i + 1));
    V.s("text", { x: x0, y: y0 + hgt + 30 }, svg, "singular value index i →");
    V.legend(svg, 8, y0 + hgt + 42, [{ color: colors.head, label: "this head (layer " + sp.layer + ", head " + sp.head + ")" },
      { color: colors.random, label: "random q, k" }, { color: colors.task, label: "lab 10's retrieval task" }], 420);

    V.clear(side);
    side.appendChild(V.h("h4", {}, "Layer " + sp.layer + ", head " + sp.head + ": how low-rank, and what each method gets wrong"));
    const dl = V.h("dl", { class: "viz-counters" });
    [["singular values for 90 % of Σσ², this head", V.num(sp.rank90, 0, { id: "approx-rank" })],
      ["… random q, k", V.num(syn.random_rank90, 0, { id: "approx-rank-random" })],
      ["… lab 10's retrieval task", V.num(syn.task_rank90, 0, { id: "approx-rank-task" })]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.table(["method", "error, this head", "error, retrieval task"], ref.methods.map(function (m, i) {
      return { cells: [m, err(rt.error[m], "approx-err-" + i), err(syn.task_error[m], "approx-task-" + i)] };
    }), { id: "approx-table" }));
    side.appendChild(V.h("p", { class: "viz-caption" }, "Error: ‖approx − exact‖ / ‖exact‖ of the row that predicts an answer digit, " +
      "over the sequence up to that row (there the model's causal attention is the unmasked attention lab 10 computes), " +
      "averaged over " + ref.problems.length + " problems × 4 answer digits. Settings scaled to N ≤ " + ref.seq_len + ": window " +
      ref.settings.window + " + token 0, stride " + ref.settings.stride + ", " + ref.settings.buckets + " buckets × " +
      ref.settings.rounds + " rounds, Linformer rank " + ref.settings.rank + ", Performer " + ref.settings.features + " features."));
  }
  render();
})();
