/* FlashAttention-3 warp specialisation: plays back fa3_schedule's two modelled timelines
 * (traces/fa3-reference.js, written by lab 00's traces.py) on one time axis, drawn with D3
 * (a linear time scale, its axis, and transitions that grow each bar up to the cursor). */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("fa3-viz");
  const ref = V.trace("fa3-reference");
  const runs = ref.runs;
  const T = runs.fa2.total_ns;
  const STEPS = 25;
  const W = 720, X0 = 112, X1 = 700, LANE = 24;
  const COLORS = { tma: "#4e79a7", wgmma: "#59a14f", softmax: "#f28e2b" };
  const NAMES = { tma: "TMA copy of a K/V tile", wgmma: "wgmma (tensor cores)", softmax: "softmax (exponentials)" };
  const panels = [
    { run: "fa2", title: "FlashAttention-2 style: no specialisation, each phase waits",
      lanes: ["all warps", "consumer 1", "consumer 2"], laneNames: ["copy (all warps)", "warpgroup 1", "warpgroup 2"] },
    { run: "fa3", title: "FlashAttention-3: producer + two ping-pong consumers",
      lanes: ["producer", "consumer 1", "consumer 2"], laneNames: ["producer (TMA)", "consumer WG 1", "consumer WG 2"] },
  ];

  const player = new V.Player(root, { steps: STEPS, render: render, name: "fa3" });
  root.appendChild(player.bar);
  const H = 40 + panels.length * (28 + 3 * LANE + 14) + 50;
  const { svg, side } = V.panes(root, "0 0 " + W + " " + H,
    "modelled timelines of one SM: copies, tensor-core GEMMs and softmax for two schedules");
  svg.classList.add("viz-svg-wide");
  const x = d3.scaleLinear().domain([0, T]).range([X0, X1]);
  const chart = d3.select(svg);
  chart.append("text").attr("x", 8).attr("y", 16).attr("class", "title")
    .text("One CTA on one H100 SM, " + ref.inputs.kv_tiles + " K/V tiles (modelled, ns)");
  let y = 34;
  panels.forEach(function (p) {
    p.y = y;
    chart.append("text").attr("x", 8).attr("y", y + 12).attr("class", "title").text(p.title);
    const g = chart.append("g").attr("class", "timeline").attr("id", "fa3-" + p.run);
    p.lanes.forEach(function (lane, i) {
      const ly = y + 20 + i * LANE;
      g.append("text").attr("x", 8).attr("y", ly + 15).attr("class", "lane-label").text(p.laneNames[i]);
      g.append("rect").attr("x", X0).attr("y", ly).attr("width", X1 - X0).attr("height", LANE - 4)
        .attr("fill", "#f4f4f4");
    });
    p.bars = g.selectAll("rect.bar").data(runs[p.run].bars).enter().append("rect")
      .attr("class", function (b) { return "bar bar-" + b.kind; })
      .attr("data-start", function (b) { return b.start; })
      .attr("data-end", function (b) { return b.end; })
      .attr("x", function (b) { return x(b.start); })
      .attr("y", function (b) { return y + 20 + p.lanes.indexOf(b.lane) * LANE + (b.kind === "softmax" ? 3 : 0); })
      .attr("height", function (b) { return b.kind === "softmax" ? LANE - 10 : LANE - 4; })
      .attr("width", 0)
      .attr("fill", function (b) { return COLORS[b.kind]; })
      .attr("stroke", "#fff").attr("stroke-width", 0.6);
    p.done = g.append("line").attr("y1", y + 18).attr("y2", y + 20 + 3 * LANE)
      .attr("x1", x(runs[p.run].total_ns)).attr("x2", x(runs[p.run].total_ns))
      .attr("stroke", "#333").attr("stroke-dasharray", "4 3").attr("opacity", 0);
    y += 28 + 3 * LANE + 14;
  });
  const axis = chart.append("g").attr("class", "axis").attr("transform", "translate(0," + (y - 6) + ")")
    .call(d3.axisBottom(x).ticks(8).tickFormat(function (t) { return d3.format(",")(t); }));
  axis.selectAll("text").attr("class", "axis-label");
  chart.append("text").attr("x", X1).attr("y", y + 28).attr("text-anchor", "end").attr("class", "axis-label")
    .text("time on the SM (ns)");
  const cursor = chart.append("line").attr("class", "cursor").attr("y1", 30).attr("y2", y - 6)
    .attr("stroke", "#d62728").attr("stroke-width", 1.5).attr("x1", X0).attr("x2", X0);
  V.legend(svg, 8, y + 16, Object.keys(COLORS).map(function (k) { return { color: COLORS[k], label: NAMES[k] }; }), 480);

  const caption = V.h("p", { class: "viz-caption", id: "fa3-caption" });
  side.appendChild(caption);
  const counters = V.h("dl", { class: "viz-counters", id: "fa3-counters" });
  side.appendChild(counters);
  side.appendChild(V.h("p", { class: "viz-note" }, [
    "A model (", V.h("code", {}, "fa3_schedule"), "), not a measurement. Per operation: copy ",
    V.num(runs.fa3.op_ns.tma, 0, { id: "fa3-op-tma" }), " ns, wgmma ",
    V.num(runs.fa3.op_ns.wgmma, 0, { id: "fa3-op-wgmma" }), " ns, softmax ",
    V.num(runs.fa3.op_ns.softmax, 0, { id: "fa3-op-softmax" }), " ns."]));

  function finished(run, t) {
    return runs[run].bars.filter(function (b) { return b.end <= t && b.kind === "wgmma"; }).length / 4;
  }
  function dt(label, value) {
    counters.appendChild(V.h("dt", {}, label));
    counters.appendChild(V.h("dd", {}, value));
  }

  function render(k) {
    const t = T * k / (STEPS - 1);
    const ms = V.reducedMotion() ? 0 : 450;
    root.setAttribute("data-time", String(t));
    cursor.transition().duration(ms).attr("x1", x(t)).attr("x2", x(t));
    panels.forEach(function (p) {
      p.bars.transition().duration(ms)
        .attr("width", function (b) { return Math.max(0, x(Math.min(b.end, t)) - x(b.start)); });
      p.done.transition().duration(ms).attr("opacity", t >= runs[p.run].total_ns ? 1 : 0);
    });
    V.clear(counters);
    dt("time", [V.num(Math.round(t), 0, { id: "fa3-time" }), " ns"]);
    ["fa2", "fa3"].forEach(function (r) {
      const n = Math.floor(finished(r, t));
      dt((r === "fa2" ? "FA2-style" : "FA3") + ": K/V tiles done", [V.num(n, 0, { id: "fa3-tiles-" + r }), " / " + ref.inputs.kv_tiles]);
    });
    ["fa2", "fa3"].forEach(function (r) {
      dt((r === "fa2" ? "FA2-style" : "FA3") + " total", [V.num(runs[r].total_ns, 0, { id: "fa3-total-" + r }), " ns"]);
      dt("  tensor cores busy", [V.num(runs[r].tensor_busy * 100, 1, { id: "fa3-busy-" + r }), " %"]);
      dt("  modelled TFLOP/s", V.num(runs[r].tflops, 0, { id: "fa3-tflops-" + r }));
    });
    dt("speed-up (model)", [V.num(ref.speedup, 2, { id: "fa3-speedup" }), "×"]);
    caption.textContent = t >= runs.fa2.total_ns
      ? "Both done: the warp-specialised schedule finished the same work in " + V.fmt(runs.fa3.total_ns / runs.fa2.total_ns * 100, 0) + " % of the time."
      : t >= runs.fa3.total_ns
        ? "FA3 is done; the synchronous schedule is still working: its tensor cores wait for each copy and each softmax."
        : "The producer copies the next K/V tiles while the consumers compute; one warpgroup's softmax (orange) runs under the other's wgmma (green).";
  }
  player.go(0);
})();
