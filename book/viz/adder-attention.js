/* A trained model's real attention: models/adder (a 2-layer Llama trained on 3-digit
 * addition) on fixed problems, every layer and head (traces/adder-reference.js, written by
 * `python -m book.attention_trace`). The heads named here were found by measurement: the
 * trace scores every head (previous-token, aligned-digit and carry-digit mass). Playback only. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("adder-viz");
  const ref = V.trace("adder-reference");
  if (!root || !ref) return;
  const top = ref.found["aligned digits"];
  const state = { run: 0, layer: top.layer, head: top.head };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  function select(id, label, options, key) {
    const sel = V.h("select", { id: id, "aria-label": label });
    options.forEach(function (o, i) { sel.appendChild(V.h("option", { value: i }, o)); });
    sel.value = String(state[key]);
    sel.addEventListener("change", function () { state[key] = Number(sel.value); render(); });
    toolbar.appendChild(V.h("label", { for: id }, [label + " ", sel]));
    return sel;
  }
  const selRun = select("adder-problem", "Problem", ref.runs.map(function (r) { return r.a + " + " + r.b; }), "run");
  const selLayer = select("adder-layer", "Layer", Array.from({ length: ref.layers }, function (_, i) { return String(i); }), "layer");
  const selHead = select("adder-head", "Head", Array.from({ length: ref.heads }, function (_, i) { return String(i); }), "head");
  root.appendChild(toolbar);
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 480", "a trained model's attention weights: query (row) by key (column)");

  function show(layer, head) {
    state.layer = layer; state.head = head; selLayer.value = String(layer); selHead.value = String(head); render();
  }

  function render() {
    const r = ref.runs[state.run], m = r.weights[state.layer][state.head], toks = r.tokens, L = toks.length;
    const eq = toks.indexOf("=");
    root.setAttribute("data-view", state.run + "-" + state.layer + "-" + state.head);
    V.clear(svg);
    const x0 = 50, y0 = 60, c = Math.floor(350 / L);
    V.s("text", { x: 10, y: 16, class: "title" }, svg, "Layer " + state.layer + ", head " + state.head + ": " +
      r.a + " + " + r.b + " (digits least-significant first)");
    V.s("text", { x: x0, y: 34 }, svg, "keys →");
    function label(t) { return t === "<bos>" ? "⟨s⟩" : t === "<eos>" ? "⟨/s⟩" : t; }
    toks.forEach(function (t, j) {
      V.s("text", { x: x0 + j * c + c / 2, y: y0 - 8, "text-anchor": "middle", "font-weight": j === eq ? 700 : 400 }, svg, label(t));
      V.s("text", { x: x0 - 6, y: y0 + j * c + c / 2 + 4, "text-anchor": "end", "font-weight": j === eq ? 700 : 400 }, svg, label(t));
    });
    for (let i = 0; i < L; i++) {
      for (let j = 0; j < L; j++) {
        const w = m[i][j];
        // the aligned operand digits of the answer digit query i predicts
        const k = i - eq, aligned = k >= 0 && k < 3 && (j === 1 + k || j === eq - 3 + k);
        V.s("rect", { x: x0 + j * c, y: y0 + i * c, width: c - 2, height: c - 2, rx: 2,
          fill: j > i ? "#fff" : "#4e79a7", "fill-opacity": j > i ? 1 : Math.max(0.04, w),
          stroke: aligned ? "#d62728" : j > i ? "#eee" : "none", "stroke-width": aligned ? 2 : 1,
          id: "adder-cell-" + i + "-" + j, "data-value": JSON.stringify(w) }, svg);
      }
    }
    V.legend(svg, 10, y0 + L * c + 14, [{ color: "#4e79a7", label: "weight (darker = more)" },
      { color: "#fff", stroke: "#d62728", label: "the aligned operand digits a_k, b_k" },
      { color: "#fff", stroke: "#eee", label: "future key (causal)" }], 400);

    V.clear(side);
    side.appendChild(V.h("h4", {}, "Heads, measured over " + ref.runs.length + " problems"));
    const idx = { prev: 0, aligned: 1, carry: 2 };
    const rows = [];
    for (let l = 0; l < ref.layers; l++) {
      for (let h = 0; h < ref.heads; h++) {
        const here = l === state.layer && h === state.head;
        rows.push({ attrs: { class: here ? "grew" : null, "data-head": l + "-" + h }, cells: [l + "." + h,
          V.num(ref.scores[idx.prev][l][h], 3, here ? { id: "adder-prev" } : {}),
          V.num(ref.scores[idx.aligned][l][h], 3, here ? { id: "adder-aligned" } : {}),
          V.num(ref.scores[idx.carry][l][h], 3, here ? { id: "adder-carry" } : {})] });
      }
    }
    side.appendChild(V.table(["layer.head", "previous token", "aligned digits", "carry digits"], rows, { id: "adder-scores" }));
    const p = V.h("p", {}, "Strongest by measurement: ");
    ref.score_names.forEach(function (nm, s) {
      const f = ref.found[nm];
      const b = V.h("button", { type: "button", "data-action": "show-" + nm.replace(/ /g, "-") },
        nm + " → " + f.layer + "." + f.head);
      b.addEventListener("click", function () { show(f.layer, f.head); });
      p.appendChild(b);
      if (s < ref.score_names.length - 1) p.appendChild(document.createTextNode(" "));
    });
    side.appendChild(p);
    side.appendChild(V.h("p", { class: "viz-caption" }, "The model answered " + r.answer_lsb_first.split("").reverse().join("") +
      (r.correct ? " (correct)." : " (wrong).") + " Model: " + ref.model + ", " + ref.layers + " layers, " + ref.heads +
      " query heads over " + ref.kv_heads + " KV heads, head dim " + ref.head_dim + "."));
  }
  render();
})();
