/* Ring attention: plays back lab 04's ring_step on 4 simulated devices
 * (traces/ring-reference.js). Q stays on its device; K/V shards move one device per step. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("ring-viz");
  const ref = V.trace("ring-reference");
  const P = ref.inputs.devices;
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"];
  let run = "full";

  const toolbar = V.h("div", { class: "viz-toolbar" });
  [["full", "Full attention"], ["causal", "Causal"]].forEach(function (o) {
    const r = V.h("input", { type: "radio", name: "ring-run", id: "ring-run-" + o[0], value: o[0] });
    if (o[0] === run) r.checked = true;
    r.addEventListener("change", function () { run = o[0]; player.go(player.step); });
    toolbar.appendChild(V.h("label", { for: "ring-run-" + o[0] }, [r, " " + o[1]]));
  });
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: P, render: render, name: "ring" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 380",
    "four devices in a ring, the K/V shard each holds, compute and communication per step");
  V.arrowDefs(svg, "ring-arrow", "#555");
  const layer = V.s("g", {}, svg);
  V.legend(svg, 10, 345, [
    { color: "#ddd", label: "Q shard (stays)" }, { color: "#4e79a7", label: "visiting K/V shard (colour = owner)" },
    { color: "#fff", stroke: "#999", dash: "3 2", label: "masked: skipped" }], 400);

  function render(k) {
    V.clear(layer);
    const st = ref.runs[run].steps[k];
    const cx = 150, cy = 128, R = 84;
    V.s("text", { x: 10, y: 16, class: "title" }, layer, "Step " + (k + 1) + ": device p holds K/V shard (p − " + k + ") mod " + P);
    st.devices.forEach(function (d, i) {
      const a = -Math.PI / 2 + i * 2 * Math.PI / P;
      const x = cx + R * Math.cos(a), y = cy + R * Math.sin(a);
      V.s("rect", { x: x - 42, y: y - 26, width: 84, height: 52, rx: 6, fill: "#fff", stroke: "#555" }, layer);
      V.s("text", { x: x - 38, y: y - 12 }, layer, "device " + d.device);
      V.s("rect", { x: x - 38, y: y - 6, width: 34, height: 24, fill: "#ddd", stroke: COLORS[d.device] }, layer);
      V.s("text", { x: x - 34, y: y + 10 }, layer, "Q" + d.device);
      V.s("rect", { x: x + 2, y: y - 6, width: 36, height: 24, id: "ring-holds-" + d.device,
        fill: d.masked ? "#fff" : COLORS[d.holds], stroke: d.masked ? "#999" : COLORS[d.holds],
        "stroke-dasharray": d.masked ? "3 2" : null }, layer);
      V.s("text", { x: x + 5, y: y + 10, class: "halo" }, layer, "KV" + d.holds);
      const b = -Math.PI / 2 + (i + 0.5) * 2 * Math.PI / P;
      V.s("path", { d: "M" + (cx + (R + 8) * Math.cos(b - 0.25)) + "," + (cy + (R + 8) * Math.sin(b - 0.25)) +
        " A" + (R + 8) + "," + (R + 8) + " 0 0 1 " + (cx + (R + 8) * Math.cos(b + 0.25)) + "," + (cy + (R + 8) * Math.sin(b + 0.25)),
        fill: "none", stroke: "#555", "stroke-width": 1.5, "marker-end": "url(#ring-arrow)" }, layer);
    });
    // compute and communication per step, per device (modelled counts)
    V.s("text", { x: 10, y: 262, class: "title" }, layer, "Per device and step: compute (bar) and send (line)");
    for (let t = 0; t < P; t++) {
      ref.runs[run].steps[t].devices.forEach(function (d, i) {
        const x = 20 + t * 95 + i * 20, busy = !d.masked;
        V.s("rect", { x: x, y: 300 - (busy ? 30 : 2), width: 14, height: busy ? 30 : 2,
          fill: t <= k ? (busy ? COLORS[d.holds] : "#bbb") : "#eee" }, layer);
      });
      V.s("line", { x1: 20 + t * 95, x2: 94 + t * 95, y1: 310, y2: 310, stroke: t <= k && t < P - 1 ? "#555" : "#eee",
        "stroke-width": 3 }, layer);
      V.s("text", { x: 30 + t * 95, y: 330 }, layer, "step " + (t + 1));
    }
    V.clear(side);
    side.appendChild(V.h("p", { class: "viz-caption" }, k < P - 1
      ? "Each device folds the visiting shard into its running (m, l, acc) with ring_step, then sends the shard on; the send of step " + (k + 1) + " overlaps the compute of step " + (k + 2) + "."
      : "Every device has seen every shard: finalize gives its rows' output" + (ref.runs[run].same_as_ring_attention ? ", equal to lab 04's ring_attention." : ".")));
    side.appendChild(V.table(["device", "holds", "m (rows)", "l (rows)"], st.devices.map(function (d) {
      return { attrs: { class: d.masked ? "" : "grew" }, cells: [String(d.device), d.masked ? "KV" + d.holds + " (masked)" : "KV" + d.holds,
        V.num(d.m, 3, { id: "ring-m-" + d.device }), V.num(d.l, 3, { id: "ring-l-" + d.device })] };
    }), { id: "ring-table" }));
    side.appendChild(V.h("p", {}, "Per step and device: " + V.count(ref.per_step.flops) + " FLOPs (Q Kᵀ and P V on a " +
      ref.inputs.shard + "-token shard) and " + V.count(ref.per_step.bytes) + " bytes of K and V (fp16) sent to the next device."));
  }
  player.go(0);
})();
