/* Sliding-window receptive field: which positions reach the last token through L layers of
 * window w. One layer's sets come from lab 06's window_decode_attention (one-hot values
 * make its output the attention weights); layers compose them (traces/window-reference.js). */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("window-viz");
  const ref = V.trace("window-reference");
  const n = ref.inputs.seq_len, windows = ref.inputs.windows;
  const state = { w: 1, layers: ref.inputs.layers };
  const toolbar = V.h("div", { class: "viz-toolbar" });
  const { input: wIn, output: wOut } = V.slider(toolbar, { id: "window-w", text: "Window ",
    min: 0, max: windows.length - 1, value: state.w, label: "window size" },
    function () { state.w = Number(wIn.value); render(); });
  const { input: lIn, output: lOut } = V.slider(toolbar, { id: "window-layers", text: "Layers ",
    min: 1, max: ref.inputs.layers, value: state.layers, label: "layers" },
    function () { state.layers = Number(lIn.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to a slider, then ← / →."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 272",
    "positions reaching the last token through each layer");

  function render() {
    const w = windows[state.w], tr = ref.windows[String(w)];
    wOut.textContent = " " + w + " ";
    lOut.textContent = " " + state.layers + " ";
    V.clear(svg);
    const cw = 16;
    V.s("text", { x: 10, y: 14, class: "title" }, svg, "Positions 0–" + (n - 1) + "; the last token at the right");
    for (let l = 0; l <= state.layers; l++) {
      const y = 30 + (state.layers - l) * 34;
      const set = l === 0 ? [n - 1] : tr.receptive_field[l - 1];
      V.s("text", { x: 4, y: y + 16 }, svg, l === 0 ? "out" : "L" + l);
      for (let j = 0; j < n; j++) {
        const inSet = set.indexOf(j) >= 0;
        V.s("rect", { x: 28 + j * cw, y: y, width: cw - 2, height: 22, rx: 2, id: l ? "window-l" + l + "-" + j : null,
          fill: inSet ? (l === 0 ? "#f28e2b" : "#4e79a7") : "#eee" }, svg);
      }
    }
    V.legend(svg, 10, 228, [{ color: "#f28e2b", label: "the token" },
      { color: "#4e79a7", label: "reaches it through the layers above" }, { color: "#eee", label: "out of reach" }], 400);
    const field = tr.receptive_field[state.layers - 1];
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    [["window", String(w)], ["layers", String(state.layers)],
      ["positions reached", V.num(field.length, 0, { id: "window-reach" })],
      ["one layer sees", V.num(tr.one_layer[n - 1].length, 0)]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("p", {}, "Each layer lets a token see the window before it; a token that saw w positions " +
      "at layer l − 1 passes them on, so the reach grows by w − 1 per layer: after L layers, L·(w − 1) + 1 positions. " +
      "Information from further back can still arrive, but only through intermediate tokens."));
  }
  render();
})();
