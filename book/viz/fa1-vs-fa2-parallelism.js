/* FlashAttention-1 vs -2: which program owns which (Q tile, K/V tile) and when, played back
 * from traces/fagrid-reference.js (FA2: lab 00's attention_grid; rows' m, l: lab 00's
 * online_softmax_steps; schedules and HBM bytes: modelled in book/traces.py). */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("fagrid-viz");
  const ref = V.trace("fagrid-reference");
  const nQ = ref.n_q, nK = ref.n_k, BH = ref.inputs.batch * ref.inputs.heads, t = ref.inputs.tile;
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"];
  let mode = "fa2";

  const toolbar = V.h("div", { class: "viz-toolbar" });
  [["fa1", "FlashAttention-1"], ["fa2", "FlashAttention-2"]].forEach(function (o) {
    const r = V.h("input", { type: "radio", name: "fagrid-mode", id: "fagrid-mode-" + o[0], value: o[0] });
    if (o[0] === mode) r.checked = true;
    r.addEventListener("change", function () { mode = o[0]; player.reset(sched().steps.length); });
    toolbar.appendChild(V.h("label", { for: "fagrid-mode-" + o[0] }, [r, " " + o[1]]));
  });
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: ref.schedules[mode].steps.length, render: render, name: "fagrid" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 380",
    "per head, a grid of Q tiles by K/V tiles coloured by the program that owns them");

  function sched() { return ref.schedules[mode]; }
  function color(p) { return COLORS[p % COLORS.length]; }

  function render(k) {
    const s = sched(), st = s.steps[k];
    V.clear(svg);
    const c = 30;
    V.s("text", { x: 10, y: 16, class: "title" }, svg, (mode === "fa1" ? "FlashAttention-1: outer loop K/V, inner loop Q" :
      "FlashAttention-2: one program per Q tile, loop over K/V") + " (time " + (k + 1) + ")");
    for (let bh = 0; bh < BH; bh++) {
      const x0 = 50 + bh * 190, y0 = 56;
      V.s("text", { x: x0, y: y0 - 22 }, svg, "batch·head " + bh + ": K/V tiles →");
      for (let kt = 0; kt < nK; kt++) V.s("text", { x: x0 + kt * c + 8, y: y0 - 6 }, svg, "K" + kt);
      for (let qt = 0; qt < nQ; qt++) {
        V.s("text", { x: x0 - 26, y: y0 + qt * c + 19 }, svg, "Q" + qt);
        for (let kt = 0; kt < nK; kt++) {
          let owner = null, when = null;
          s.steps.forEach(function (step, time) {
            step.work.forEach(function (w) { if (w.bh === bh && w.qt === qt && w.kt === kt) { owner = w.program; when = time; } });
          });
          const active = when === k, done = when !== null && when < k;
          V.s("rect", { x: x0 + kt * c, y: y0 + qt * c, width: c - 3, height: c - 3, rx: 3,
            fill: color(owner), "fill-opacity": active ? 1 : done ? 0.45 : 0.12,
            stroke: active ? "#222" : "#ccc", "stroke-width": active ? 2.5 : 1,
            id: "fagrid-cell-" + bh + "-" + qt + "-" + kt, "data-program": owner, "data-active": active ? "true" : null }, svg);
          V.s("text", { x: x0 + kt * c + 4, y: y0 + qt * c + 18, class: active ? "halo" : null }, svg, "p" + owner);
        }
      }
    }
    // programs as lanes on a time axis
    // the time axis spans the longer schedule, so the two can be compared
    const P = s.grid[0], T = s.steps.length, ly = 196, lw = 320;
    const Tmax = Math.max(ref.schedules.fa1.steps.length, ref.schedules.fa2.steps.length);
    V.s("text", { x: 10, y: ly - 6, class: "title" }, svg, P + " programs: each lane is one program's work over time");
    for (let p = 0; p < P; p++) {
      const y = ly + p * (P > 4 ? 13 : 22), hh = P > 4 ? 10 : 16;
      V.s("text", { x: 10, y: y + 9, style: "font-size: 9px" }, svg, "p" + p);
      V.s("rect", { x: 40, y: y, width: lw * T / Tmax, height: hh, fill: color(p), "fill-opacity": 0.15 }, svg);
      V.s("rect", { x: 40, y: y, width: lw * (k + 1) / Tmax, height: hh, fill: color(p) }, svg);
    }
    V.s("line", { x1: 40, x2: 40 + lw, y1: ly + 112, y2: ly + 112, stroke: "#999" }, svg);
    for (let x = 0; x <= Tmax; x += 4) V.s("text", { x: 36 + lw * x / Tmax, y: ly + 124 }, svg, String(x));
    V.s("text", { x: 40 + lw, y: ly + 140, "text-anchor": "end" }, svg, "time steps");
    V.legend(svg, 10, 340, [{ color: "#4e79a7", label: "tile pair of a program (colour)" },
      { color: "#fff", stroke: "#222", label: "worked on now" }, { color: "#c9d3df", label: "done / still to do (faint)" }], 400);
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    const sms = ref.sms["A100 SXM4 80GB"];
    [["programs (grid)", V.num(P, 0, { id: "fagrid-programs" })],
      ["time steps to finish", V.num(T, 0, { id: "fagrid-steps" })],
      ["SMs busy (A100: " + sms + ")", V.h("span", {}, Math.min(P, sms) + " of " + sms)],
      ["HBM bytes so far (modelled)", V.num(st.hbm, 0, { id: "fagrid-hbm" })]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("h4", {}, "Now: each program's tile pair, and its rows' m and l after it"));
    side.appendChild(V.table(["prog", "Q", "K/V", "m (" + t + " rows)", "l"], st.work.map(function (w) {
      return { attrs: { "data-program": w.program }, cells: [String(w.program), "Q" + w.qt + (BH > 1 ? "·h" + w.bh : ""), "K" + w.kt,
        V.num(w.m, 2, { id: "fagrid-m-" + w.program }), V.num(w.l, 2, { id: "fagrid-l-" + w.program })] };
    }), { id: "fagrid-table" }));
    side.appendChild(V.h("p", {}, mode === "fa1"
      ? "Each inner step reads the Q tile and its partial O, l, m from HBM and writes O, l, m back: the state of a Q tile lives in HBM between K/V tiles."
      : "Each program keeps its Q tile and its running m, l, acc on chip for the whole K/V loop and writes O and the log-sum-exp once, at the end."));
  }
  player.go(0);
})();
