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

  // ---- at a real size, side by side: SMs busy over time for both schedules (D3 scales)
  const occ = ref.occupancy, oin = ref.occupancy_inputs;
  const wide = V.h("div", { class: "viz-wide", id: "fagrid-occupancy" });
  root.appendChild(wide);
  wide.appendChild(V.h("h4", {}, "At a real size: " + oin.heads + " heads × " + V.count(oin.seq) +
    " tokens, tiles of " + oin.tile + " (a model: one program per SM at a time)"));
  const obar = V.h("div", { class: "viz-toolbar" });
  const gpuSel = V.h("select", { id: "fagrid-gpu", "aria-label": "GPU" });
  Object.keys(occ).forEach(function (g) { gpuSel.appendChild(V.h("option", { value: g }, g + " (" + ref.sms[g] + " SMs)")); });
  const batchSel = V.h("select", { id: "fagrid-batch", "aria-label": "batch size" });
  oin.batches.forEach(function (b, i) { batchSel.appendChild(V.h("option", { value: String(i) }, "batch " + b)); });
  obar.appendChild(V.h("label", { for: "fagrid-gpu" }, ["GPU ", gpuSel]));
  obar.appendChild(V.h("label", { for: "fagrid-batch" }, ["Batch ", batchSel]));
  wide.appendChild(obar);
  const osvg = V.s("svg", { class: "viz-svg viz-svg-wide", viewBox: "0 0 720 200", role: "img",
    "aria-label": "busy SMs over time for FlashAttention-1 and FlashAttention-2, side by side" });
  wide.appendChild(osvg);
  const oread = V.h("dl", { class: "viz-counters", id: "fagrid-occ-counters" });
  wide.appendChild(oread);
  const og = d3.select(osvg);
  const PW = 320, PH = 120, OY = 34;
  const sides = [["fa1", "FlashAttention-1: one program per batch·head", 30], ["fa2", "FlashAttention-2: + one per Q tile", 380]];
  const ox = d3.scaleLinear().range([0, PW]);
  const oy = d3.scaleLinear().range([0, PH]);
  sides.forEach(function (sd) {
    const gg = og.append("g").attr("id", "fagrid-occ-" + sd[0]).attr("transform", "translate(" + sd[2] + "," + OY + ")");
    og.append("text").attr("x", sd[2]).attr("y", 22).attr("class", "title").text(sd[1]);
    gg.append("rect").attr("class", "occ-frame").attr("width", PW).attr("height", PH).attr("fill", "#f4f4f4");
    gg.append("rect").attr("class", "occ-full").attr("fill", sd[0] === "fa1" ? "#4e79a7" : "#f28e2b").attr("height", PH);
    gg.append("rect").attr("class", "occ-last").attr("fill", sd[0] === "fa1" ? "#4e79a7" : "#f28e2b");
    gg.append("rect").attr("class", "occ-idle").attr("fill", "#bbb");
    gg.append("g").attr("class", "axis").attr("transform", "translate(0," + PH + ")");
  });
  og.append("text").attr("x", 710).attr("y", 194).attr("text-anchor", "end").attr("class", "axis-label")
    .text("time (tile pairs per SM); grey: SMs idle in the last wave; height: the SMs");
  function renderOcc() {
    const g = gpuSel.value, r = occ[g][Number(batchSel.value)], sms = ref.sms[g];
    const ms = V.reducedMotion() ? 0 : 500;
    ox.domain([0, Math.max(r.fa1.time, r.fa2.time)]);
    oy.domain([0, sms]);
    wide.setAttribute("data-batch", String(r.batch));
    sides.forEach(function (sd) {
      const s = r[sd[0]], gg = og.select("#fagrid-occ-" + sd[0]);
      const full = (s.waves - 1) * s.work;
      gg.select(".occ-full").transition().duration(ms).attr("width", ox(full));
      gg.select(".occ-last").transition().duration(ms).attr("x", ox(full)).attr("width", ox(s.work))
        .attr("height", oy(s.last_wave_busy));
      gg.select(".occ-idle").transition().duration(ms).attr("x", ox(full)).attr("width", ox(s.work))
        .attr("y", oy(s.last_wave_busy)).attr("height", PH - oy(s.last_wave_busy));
      gg.select(".axis").transition().duration(ms).call(d3.axisBottom(ox).ticks(4).tickFormat(d3.format("~s")));
      gg.selectAll(".axis text").attr("class", "axis-label");
    });
    V.clear(oread);
    function dt(label, value) { oread.appendChild(V.h("dt", {}, label)); oread.appendChild(V.h("dd", {}, value)); }
    ["fa1", "fa2"].forEach(function (n) {
      const s = r[n], name = n === "fa1" ? "FlashAttention-1" : "FlashAttention-2";
      dt(name + ": programs, waves", [V.num(s.programs, 0, { id: "fagrid-occ-programs-" + n }), " programs, ",
        V.num(s.waves, 0, { id: "fagrid-occ-waves-" + n }), " wave" + (s.waves > 1 ? "s" : "")]);
      dt(name + ": SM time used", [V.num(s.utilisation * 100, 1, { id: "fagrid-occ-util-" + n }), " %, time ",
        V.num(s.time, 0, { id: "fagrid-occ-time-" + n })]);
    });
    dt("FlashAttention-2's speed-up (model)", [V.num(r.speedup, 2, { id: "fagrid-occ-speedup" }), "×"]);
  }
  gpuSel.addEventListener("change", renderOcc);
  batchSel.addEventListener("change", renderOcc);
  renderOcc();
})();
