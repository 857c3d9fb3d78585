/* GPU memory hierarchy: capacities of each tier for A100 and H100 (sources in the trace),
 * and the score matrix of standard attention (lab 00's score_matrix_bytes) against them
 * (traces/memory-reference.js). */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("memory-viz");
  const ref = V.trace("memory-reference");
  const names = Object.keys(ref.gpus);
  const state = { gpu: names.length - 1, seq: 4 };
  const toolbar = V.h("div", { class: "viz-toolbar" });
  names.forEach(function (nm, i) {
    const r = V.h("input", { type: "radio", name: "memory-gpu", id: "memory-gpu-" + i, value: i });
    if (i === state.gpu) r.checked = true;
    r.addEventListener("change", function () { state.gpu = i; render(); });
    toolbar.appendChild(V.h("label", { for: "memory-gpu-" + i }, [r, " " + nm]));
  });
  const { input: sIn, output: sOut } = V.slider(toolbar, { id: "memory-seq", text: "Sequence ",
    min: 0, max: ref.seq_lens.length - 1, value: state.seq, label: "sequence length" },
    function () { state.seq = Number(sIn.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to a control, then ← / →."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 330",
    "memory tiers with their capacities, and the score matrix size");

  function render() {
    const g = ref.gpus[names[state.gpu]], n = ref.seq_lens[state.seq], s = ref.score_matrix_bytes[state.seq];
    sOut.textContent = " " + V.count(n) + " tokens ";
    const tiers = [
      ["Registers", g.regs_per_sm_bytes, "per SM (× " + g.sms + " SMs)"],
      ["Shared memory / L1", g.smem_per_sm_bytes, "per SM: home of FlashAttention's tiles"],
      ["L2 cache", g.l2_bytes, "shared by all SMs"],
      ["HBM", g.hbm_bytes, V.count(g.hbm_tbps * 1000) + " GB/s"],
      ["Host memory", null, g.host],
    ];
    V.clear(svg);
    V.s("text", { x: 10, y: 16, class: "title" }, svg, names[state.gpu] + ": closer to the cores = smaller and faster");
    tiers.forEach(function (t, i) {
      const y = 28 + i * 46, w = 210 + i * 42;
      const fits = t[1] !== null && s <= (i < 2 ? t[1] * g.sms : t[1]);
      V.s("rect", { x: 210 - w / 2, y: y, width: w, height: 38, rx: 4, fill: i < 2 ? "#fff7ec" : i === 2 ? "#eef5ff" : i === 3 ? "#f4effa" : "#f0f0f0",
        stroke: fits ? "#2ca02c" : "#999", "stroke-width": fits ? 2.5 : 1, id: "memory-tier-" + i }, svg);
      const size = t[1] === null ? "" : i === 3 ? ": " + t[1] / 1e9 + " GB" : ": " + V.bytes(t[1]);
      V.s("text", { x: 210 - w / 2 + 6, y: y + 15, class: "title" }, svg, t[0] + size);
      V.s("text", { x: 210 - w / 2 + 6, y: y + 31 }, svg, t[2]);
    });
    V.legend(svg, 10, 262, [{ color: "#fff", stroke: "#2ca02c", label: "the L×L score matrix fits (whole chip)" },
      { color: "#fff7ec", label: "on the SM" }, { color: "#f4effa", label: "off chip" }], 400);
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    const passes = 4 * s;  // write S, read S, write P, read P: the unfused path of lab 00
    [["score matrix S (one head)", V.h("span", { id: "memory-s", "data-value": JSON.stringify(s) }, V.bytes(s))],
      ["4 passes through HBM", V.bytes(passes)],
      ["time at " + g.hbm_tbps + " TB/s", (passes / (g.hbm_tbps * 1e12) * 1e3).toFixed(3) + " ms"],
      ["FlashAttention writes of S", "0 B: one tile at a time in shared memory"]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("p", {}, "S = lab 00's score_matrix_bytes(" + n + ") at 2 bytes per score. Standard attention writes S, reads it " +
      "for the softmax, writes P and reads it again for P·V: four passes over an L×L matrix, per head and layer. " +
      "Datasheet figures, not measurements."));
    side.appendChild(V.h("p", { class: "viz-caption" }, "Sources: " + g.source + ". Per-SM registers and shared memory: " +
      ref.limit_sources[0]));
  }
  render();
})();
