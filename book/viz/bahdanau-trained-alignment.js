/* A trained Bahdanau model's alignment beside the expected one: models/dates (bidirectional
 * GRU encoder, additive attention, GRU decoder) rewriting held-out ISO dates day first
 * (traces/dates-reference.js, written by `python -m book.alignment_trace`: the weights are
 * lab 08's additive_scores and softmax on the model's own states). Playback only. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("dates-viz");
  const ref = V.trace("dates-reference");
  if (!root || !ref) return;
  const state = { run: 0 };
  const T = ref.runs[0].weights.length, S = ref.runs[0].source.length;
  const toolbar = V.h("div", { class: "viz-toolbar" });
  const sel = V.h("select", { id: "dates-date", "aria-label": "Date" });
  ref.runs.forEach(function (r, i) { sel.appendChild(V.h("option", { value: i }, r.source)); });
  sel.addEventListener("change", function () { state.run = Number(sel.value); player.go(player.step || 0); });
  toolbar.appendChild(V.h("label", { for: "dates-date" }, ["Date ", sel]));
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: T, render: render, name: "dates" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 440 350",
    "learned alignment beside the expected one: output characters (rows) by source characters (columns)");

  function shade(w) { // weight 0..1 -> white..blue (as on the Bahdanau page)
    const t = Math.max(0, Math.min(1, w));
    const c = function (a, b) { return Math.round(a + (b - a) * t); };
    return "rgb(" + c(255, 33) + "," + c(255, 84) + "," + c(255, 150) + ")";
  }
  function outChar(r, i) { return i < r.answer.length ? r.answer[i] : "⟨/s⟩"; }

  function grid(x0, y0, c, title, cell, k, r) {
    V.s("text", { x: x0, y: y0 - 24, "font-weight": 700 }, svg, title);
    for (let j = 0; j < S; j++) {
      V.s("text", { x: x0 + j * c + c / 2, y: y0 - 6, "text-anchor": "middle" }, svg, r.source[j]);
    }
    for (let i = 0; i < T; i++) {
      V.s("text", { x: x0 - 5, y: y0 + i * c + c - 5, "text-anchor": "end", "font-weight": i === k ? 700 : 400 },
        svg, outChar(r, i));
      for (let j = 0; j < S; j++) {
        const a = cell(i, j);
        V.s("rect", Object.assign({ x: x0 + j * c, y: y0 + i * c, width: c - 2, height: c - 2, rx: 2,
          fill: a.fill, stroke: i === k ? "#f28e2b" : "#ddd", "stroke-width": i === k ? 2 : 0.5 }, a.attrs || {}), svg);
      }
    }
  }

  function render(k) {
    const r = ref.runs[state.run], exp = ref.expected_source;
    root.setAttribute("data-view", state.run + "-" + k);
    V.clear(svg);
    V.s("text", { x: 8, y: 16, class: "title" }, svg, r.source + " → " + r.answer + ": α[i, j] learned vs expected");
    const c = 17, y0 = 66;
    grid(44, y0, c, "learned α (the model)", function (i, j) {
      const w = i <= k ? r.weights[i][j] : null;
      return { fill: w === null ? "#f3f3f3" : shade(w),
        attrs: { id: "dates-cell-" + i + "-" + j, "data-value": JSON.stringify(w) } };
    }, k, r);
    grid(256, y0, c, "expected (what is copied)", function (i, j) {
      const e = i < exp.length && /[0-9]/.test(r.source[exp[i]]) ? exp[i] : null;
      const on = e === j;
      return { fill: on ? shade(1) : e === null ? "#e8e8e8" : "#fff",
        attrs: { id: "dates-expected-" + i + "-" + j, "data-value": JSON.stringify(on ? 1 : 0) } };
    }, k, r);
    V.s("text", { x: 8, y: y0 + T * c + 16 }, svg, "↑ output steps (rows), source characters → (columns)");
    V.legend(svg, 8, y0 + T * c + 28, [{ color: shade(0.05), label: "little weight" }, { color: shade(0.9), label: "much weight" },
      { color: "#e8e8e8", label: "a constant: no source to copy" }, { color: "#f3f3f3", label: "step not reached" },
      { color: "#fff", stroke: "#f28e2b", label: "this step" }], 420);

    V.clear(side);
    const want = k < exp.length ? exp[k] : null, digit = want !== null && /[0-9]/.test(r.source[want]);
    side.appendChild(V.h("h4", {}, "Output step " + k + ": writes “" + outChar(r, k) + "”" +
      (digit ? ", a copy of source character " + want + " (“" + r.source[want] + "”)" : "")));
    side.appendChild(V.table(["j", "source", "score e[" + k + ", j]", "weight α"], r.source.split("").map(function (ch, j) {
      return { attrs: { class: j === want && digit ? "grew" : null },
        cells: [String(j), ch, V.num(r.scores[k][j], 2, { id: "dates-e-" + j }), V.num(r.weights[k][j], 3, { id: "dates-w-" + j })] };
    }), { id: "dates-table" }));
    const dl = V.h("dl", { class: "viz-counters" });
    const ho = ref.held_out;
    const pairs = [["held-out dates, exact answers", V.num(ho.exact, 4, { id: "dates-exact" })],
      ["output digits whose largest weight is on the copied digit", V.num(ho.digits_argmax, 4, { id: "dates-argmax" })],
      ["mean weight on the copied digit", V.num(ho.digits_mass, 3, { id: "dates-mass" })]];
    if (k < exp.length) {
      pairs.push(["this position, over " + ho.dates + " held-out dates: weight on " +
        (digit ? "the copied digit" : "source character " + exp[k]), V.num(ho.mass_on_copied[k], 3, { id: "dates-mass-here" })]);
    }
    pairs.forEach(function (p) { dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1])); });
    side.appendChild(dl);
    side.appendChild(V.h("p", { class: "viz-caption" }, digit
      ? "The decoder state asks where its digit is, and the additive score answers with a position the model learned: day first, from the end of the source."
      : "A separator or the end: the answer is the same for every date, so nothing in the source is worth looking at and the weights spread out."));
    side.appendChild(V.h("p", { class: "viz-caption" }, "Weights: lab 08's additive_scores and softmax on the model's own decoder and encoder states; they match the weights the model used to within " +
      ref.max_abs_diff_below + "."));
  }
  player.go(0);
})();
