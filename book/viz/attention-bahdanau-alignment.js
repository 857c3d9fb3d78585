/* Bahdanau alignment: plays back lab 08's additive_scores, softmax and softmax_entropy on
 * 5 decoder states against 6 encoder states (traces/bahdanau-reference.js), one decoder
 * step at a time. The context vector is the trace's weights times the encoder states. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("bahdanau-viz");
  const ref = V.trace("bahdanau-reference");
  const T = ref.inputs.target, S = ref.inputs.source;
  const player = new V.Player(root, { steps: T, render: render, name: "bahdanau" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 345",
    "alignment map: decoder steps against encoder states, weights as shades");

  function shade(w) { // weight 0..1 -> white..blue
    const t = Math.max(0, Math.min(1, typeof w === "number" ? w : 0));
    const c = function (a, b) { return Math.round(a + (b - a) * t); };
    return "rgb(" + c(255, 33) + "," + c(255, 84) + "," + c(255, 150) + ")";
  }

  function render(k) {
    V.clear(svg);
    const x0 = 80, y0 = 62, c = 44;
    V.s("text", { x: 10, y: 16, class: "title" }, svg, "α[i, j] = softmax_j(v_a · tanh(s_i W_q + h_j W_k))");
    for (let j = 0; j < S; j++) V.s("text", { x: x0 + j * c + 14, y: y0 - 8 }, svg, "h" + j);
    V.s("text", { x: x0, y: y0 - 26 }, svg, "encoder states (source positions) →");
    for (let i = 0; i < T; i++) {
      V.s("text", { x: 30, y: y0 + i * c + 26, "font-weight": i === k ? 700 : 400 }, svg, "s" + i);
      for (let j = 0; j < S; j++) {
        const shown = i <= k, w = ref.steps[i].weights ? ref.steps[i].weights[j] : null;
        V.s("rect", { x: x0 + j * c, y: y0 + i * c, width: c - 3, height: c - 3, rx: 3,
          fill: shown ? shade(w) : "#f3f3f3", stroke: i === k ? "#f28e2b" : "#ddd", "stroke-width": i === k ? 2 : 1,
          id: "bahdanau-cell-" + i + "-" + j, "data-value": shown ? JSON.stringify(w) : null }, svg);
        if (shown) V.s("text", { x: x0 + j * c + 6, y: y0 + i * c + 25, class: "halo" }, svg, V.fmt(w, 2));
      }
    }
    V.s("text", { x: 4, y: y0 + T * c + 14 }, svg, "↑ decoder steps");
    V.legend(svg, 10, 312, [{ color: shade(0.05), label: "little weight" }, { color: shade(0.6), label: "much weight" },
      { color: "#f3f3f3", label: "step not reached" }, { color: "#fff", stroke: "#f28e2b", label: "this step" }], 400);
    const st = ref.steps[k];
    V.clear(side);
    side.appendChild(V.h("h4", {}, "Decoder step " + k + ": state s" + k));
    side.appendChild(V.table(["j", "score e[" + k + ", j]", "weight α"], st.scores.map(function (e, j) {
      return { cells: [String(j), V.num(e, 3, { id: "bahdanau-e-" + j }), V.num(st.weights[j], 3, { id: "bahdanau-w-" + j })] };
    }), { id: "bahdanau-table" }));
    const dl = V.h("dl", { class: "viz-counters" });
    [["entropy (nats)", V.num(st.entropy, 3, { id: "bahdanau-entropy" })],
      ["uniform would be", "log " + S + " = " + V.fmt(Math.log(S), 3)],
      ["context c" + k + " = Σ α h", V.num(st.context, 3, { id: "bahdanau-context" })]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("p", { class: "viz-caption" }, "The context vector goes into the decoder with s" + k +
      " to produce output " + k + ". Each step reads every encoder state again: the source is never squeezed into one fixed-size vector."));
  }
  player.go(0);
})();
