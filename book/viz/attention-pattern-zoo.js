/* Attention pattern zoo: lab 10's sparse masks on 16 tokens (the "zoo" part of
 * traces/lab10-reference.js), and your starter's when `make trace LAB=10` made one:
 * which (query, key) pairs each pattern scores, how many, and sparse_attention's error
 * against exact attention on random inputs. Choosing a pattern only picks a traced mask. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("zoo-viz");
  const ref = V.trace("lab10-reference").zoo;
  const starter = V.trace("lab10-starter");
  const mine = starter && starter.page_diffs ? Object.assign({}, starter, { first_diff: starter.page_diffs.zoo }) : starter;
  const minePatterns = starter && starter.zoo ? starter.zoo.patterns : null;
  const n = ref.inputs.n;
  const state = { k: 0 };

  const toolbar = V.h("div", { class: "viz-toolbar", role: "radiogroup", "aria-label": "pattern" });
  ref.patterns.forEach(function (pt, i) {
    const id = "zoo-pattern-" + i;
    const r = V.h("input", { type: "radio", name: "zoo-pattern", id: id, value: i });
    if (i === state.k) r.checked = true;
    r.addEventListener("change", function () { state.k = i; render(); });
    toolbar.appendChild(V.h("label", { for: id }, [r, " " + pt.name]));
  });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to the patterns, then ← / → to move between them."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 410",
    "the mask: queries as rows, keys as columns, scored pairs filled");
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  V.starterPanel(wide, "10", mine, function (k) { document.getElementById("zoo-pattern-" + k).click(); });

  function render() {
    const pt = ref.patterns[state.k];
    root.setAttribute("data-pattern", pt.name);
    V.clear(svg);
    const x0 = 40, y0 = 40, c = 20;
    V.s("text", { x: 10, y: 16, class: "title" }, svg, pt.call);
    V.s("text", { x: x0, y: y0 - 8 }, svg, "keys j →");
    for (let i = 0; i < n; i++) {
      if (i % 4 === 0) V.s("text", { x: 12, y: y0 + i * c + 14 }, svg, "q" + i);
      for (let j = 0; j < n; j++) {
        const on = pt.rows && pt.rows[i][j] === "1";
        const yours = minePatterns && minePatterns[state.k].rows ? minePatterns[state.k].rows[i][j] : null;
        const differs = yours !== null && yours !== (on ? "1" : "0");
        V.s("rect", { x: x0 + j * c, y: y0 + i * c, width: c - 2, height: c - 2, rx: 2,
          fill: on ? "#4e79a7" : "#f1f1f1", id: "zoo-cell-" + i + "-" + j, "data-value": on ? "1" : "0",
          stroke: differs ? "#d62728" : null, "stroke-width": differs ? 2.5 : null, "data-yours": differs ? yours : null }, svg);
      }
    }
    V.legend(svg, 10, y0 + n * c + 12, [{ color: "#4e79a7", label: "scored: query i reads key j" },
      { color: "#f1f1f1", label: "skipped: never read" }, { color: "#fff", stroke: "#d62728", label: "your mask differs" }], 400);
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    [["pairs scored", V.num(pt.pairs, 0, { id: "zoo-pairs" })],
      ["of all " + n + " × " + n, V.num(ref.all_pairs, 0)],
      ["fraction", V.h("span", {}, (100 * pt.pairs / ref.all_pairs).toFixed(1) + " %")],
      ["direction", pt.causal ? "causal" : "bidirectional"],
      ["relative error of sparse_attention", V.num(pt.relative_error, 3, { id: "zoo-error" })]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.table(["pattern", "pairs", "error"], ref.patterns.map(function (q, i) {
      return { attrs: { class: i === state.k ? "grew" : "" }, cells: [q.name, V.num(q.pairs, 0), V.num(q.relative_error, 3)] };
    }), { id: "zoo-table" }));
    side.appendChild(V.h("p", {}, "The error is ‖out − exact‖ / ‖exact‖ over all 16 rows, against exact attention of the same " +
      "direction, on random queries and keys: with no structure in the data, every skipped pair loses some weight. " +
      "A pattern pays off when the weight it skips is small (local text, a few global tokens)."));
  }
  render();
})();
