/* Ring attention: plays back lab 04's ring_step on 4 simulated devices
 * (traces/ring-reference.js). Q stays on its device; K/V shards travel one device per step
 * (a D3 transition along the ring). Below, lab 04's ring_timeline at a real size: compute and
 * send per step, overlapped against not overlapped, with the wall time so far. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("ring-viz");
  const ref = V.trace("ring-reference");
  const P = ref.inputs.devices;
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"];
  const shards = ref.timing_inputs.shards;
  let run = "full", shard = String(shards[2]);

  const toolbar = V.h("div", { class: "viz-toolbar" });
  [["full", "Full attention"], ["causal", "Causal"]].forEach(function (o) {
    const r = V.h("input", { type: "radio", name: "ring-run", id: "ring-run-" + o[0], value: o[0] });
    if (o[0] === run) r.checked = true;
    r.addEventListener("change", function () { run = o[0]; player.go(player.step); });
    toolbar.appendChild(V.h("label", { for: "ring-run-" + o[0] }, [r, " " + o[1]]));
  });
  const sel = V.h("select", { id: "ring-shard", "aria-label": "tokens per device" });
  shards.forEach(function (s) {
    const o = V.h("option", { value: String(s) }, V.count(s) + " tokens per device");
    if (String(s) === shard) o.selected = true;
    sel.appendChild(o);
  });
  sel.addEventListener("change", function () { shard = sel.value; player.go(player.step); });
  toolbar.appendChild(V.h("label", { for: "ring-shard" }, ["Timing at ", sel]));
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: P, render: render, name: "ring" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 330",
    "four devices in a ring, the K/V shard each holds, moving one device per step");
  V.arrowDefs(svg, "ring-arrow", "#555");
  const g = d3.select(svg);
  const cx = 170, cy = 150, R = 96;
  const angle = function (i) { return -Math.PI / 2 + i * 2 * Math.PI / P; };
  const title = g.append("text").attr("x", 10).attr("y", 16).attr("class", "title");
  d3.range(P).forEach(function (i) {  // the ring's links
    const b = angle(i + 0.5);
    const a0 = b - 0.28, a1 = b + 0.28, r = R + 10;
    g.append("path").attr("d", "M" + (cx + r * Math.cos(a0)) + "," + (cy + r * Math.sin(a0)) + " A" + r + "," + r +
      " 0 0 1 " + (cx + r * Math.cos(a1)) + "," + (cy + r * Math.sin(a1)))
      .attr("fill", "none").attr("stroke", "#555").attr("stroke-width", 1.5).attr("marker-end", "url(#ring-arrow)");
  });
  d3.range(P).forEach(function (i) {  // the devices, each with its Q shard and a slot
    const x = cx + R * Math.cos(angle(i)), y = cy + R * Math.sin(angle(i));
    g.append("rect").attr("x", x - 44).attr("y", y - 28).attr("width", 88).attr("height", 56).attr("rx", 6)
      .attr("fill", "#fff").attr("stroke", "#555");
    g.append("text").attr("x", x - 40).attr("y", y - 14).text("device " + i);
    g.append("rect").attr("x", x - 40).attr("y", y - 6).attr("width", 34).attr("height", 26).attr("fill", "#ddd")
      .attr("stroke", COLORS[i]);
    g.append("text").attr("x", x - 36).attr("y", y + 11).text("Q" + i);
    g.append("rect").attr("id", "ring-holds-" + i).attr("class", "ring-slot").attr("x", x + 2).attr("y", y - 6)
      .attr("width", 38).attr("height", 26).attr("fill", "none").attr("stroke", "#999");
  });
  // the travelling K/V shards, keyed by their owner: a transition moves each along the ring
  const chips = g.selectAll("g.ring-chip").data(d3.range(P)).enter().append("g").attr("class", "ring-chip")
    .attr("id", function (s) { return "ring-chip-" + s; });
  chips.append("rect").attr("x", 0).attr("y", 0).attr("width", 34).attr("height", 22).attr("rx", 3)
    .attr("fill", function (s) { return COLORS[s]; });
  chips.append("text").attr("x", 4).attr("y", 15).attr("class", "halo").text(function (s) { return "KV" + s; });
  const where = {};  // shard -> the device it was drawn at
  V.legend(svg, 10, 296, [
    { color: "#ddd", label: "Q shard (stays)" }, { color: "#4e79a7", label: "K/V shard (colour = owner)" },
    { color: "#fff", stroke: "#999", dash: "3 2", label: "masked: skipped" }], 400);

  // ---- the timing: lab 04's ring_timeline, drawn with a D3 time scale and axis
  const tsvg = V.s("svg", { class: "viz-svg viz-svg-wide", id: "ring-timeline", viewBox: "0 0 720 190", role: "img",
    "aria-label": "compute and send per ring step, overlapped and not, on one time axis" });
  const wide = V.h("div", { class: "viz-wide" });
  wide.appendChild(tsvg);
  root.appendChild(wide);
  const tg = d3.select(tsvg);
  const X0 = 112, X1 = 700;
  const lanes = [["ring overlapped", "overlapped"], ["ring, no overlap", "no overlap"]];
  const tx = d3.scaleLinear().range([X0, X1]);
  const tTitle = tg.append("text").attr("x", 8).attr("y", 16).attr("class", "title");
  lanes.forEach(function (l, i) {
    tg.append("text").attr("x", 8).attr("y", 48 + i * 54).attr("class", "lane-label").text(l[1]);
    tg.append("rect").attr("x", X0).attr("y", 30 + i * 54).attr("width", X1 - X0).attr("height", 40).attr("fill", "#f4f4f4");
  });
  const barsG = tg.append("g");
  const axisG = tg.append("g").attr("class", "axis").attr("transform", "translate(0,140)");
  tg.append("text").attr("x", X1).attr("y", 170).attr("text-anchor", "end").attr("class", "axis-label").text("wall time (µs, modelled)");
  V.legend(tsvg, 8, 160, [{ color: "#59a14f", label: "compute (ring_step)" }, { color: "#4e79a7", label: "send K/V to next device" }], 420);
  const tcursor = tg.append("g");

  function layout(tm) {  // bars {lane, kind, step, start, end} of both schedules
    const bars = [];
    let a = 0, b = 0;
    tm.steps.forEach(function (s) {
      bars.push({ lane: 0, kind: "compute", step: s.step, start: a, end: a + s.compute_us });
      if (s.send_us) bars.push({ lane: 0, kind: "send", step: s.step, start: a, end: a + s.send_us });
      a += Math.max(s.compute_us, s.send_us);
      bars.push({ lane: 1, kind: "compute", step: s.step, start: b, end: b + s.compute_us });
      b += s.compute_us;
      if (s.send_us) bars.push({ lane: 1, kind: "send", step: s.step, start: b, end: b + s.send_us });
      b += s.send_us;
    });
    return { bars: bars, ends: [a, b] };
  }
  function wallAfter(tm, k, lane) {
    return tm.steps.slice(0, k + 1).reduce(function (acc, s) {
      return acc + (lane === 0 ? Math.max(s.compute_us, s.send_us) : s.compute_us + s.send_us);
    }, 0);
  }

  function render(k) {
    const st = ref.runs[run].steps[k];
    const ms = V.reducedMotion() ? 0 : 600;
    title.text("Step " + (k + 1) + ": device p holds K/V shard (p − " + k + ") mod " + P);
    st.devices.forEach(function (d) {
      d3.select("#ring-holds-" + d.device).attr("stroke-dasharray", d.masked ? "3 2" : null)
        .attr("stroke", d.masked ? "#999" : COLORS[d.holds]);
    });
    chips.each(function (s) {
      const dev = st.devices.find(function (d) { return d.holds === s; }).device;
      const from = where[s] === undefined ? dev : where[s];
      const masked = st.devices[dev].masked;
      let to = dev;
      if (to < from) to += P;  // always forward around the ring
      d3.select(this).interrupt().transition().duration(from === dev ? 0 : ms)
        .attr("opacity", masked ? 0.35 : 1)
        .attrTween("transform", function () {
          return function (u) {
            const a = angle(from + (to - from) * u);
            const rr = from === dev ? R : R + 22 * Math.sin(Math.PI * u);
            return "translate(" + (cx + rr * Math.cos(a) + 4) + "," + (cy + rr * Math.sin(a) - 4) + ")";
          };
        });
      where[s] = dev;
    });
    // timing
    const tm = ref.timing[shard];
    const lay = layout(tm);
    tx.domain([0, Math.max(lay.ends[0], lay.ends[1])]);
    axisG.call(d3.axisBottom(tx).ticks(7).tickFormat(d3.format(",.3~r")));
    axisG.selectAll("text").attr("class", "axis-label");
    tTitle.text(V.count(tm.shard) + " tokens per device, Llama-3-8B-like attention on 4 H100s (a model at peak rates)");
    const bars = barsG.selectAll("rect").data(lay.bars);
    bars.enter().append("rect").merge(bars)
      .attr("class", function (b) { return "ring-bar ring-" + b.kind; })
      .attr("y", function (b) { return 30 + b.lane * 54 + (b.kind === "send" ? 24 : 2); })
      .attr("height", function (b) { return b.kind === "send" ? 14 : 20; })
      .attr("fill", function (b) { return b.kind === "send" ? "#4e79a7" : "#59a14f"; })
      .attr("opacity", function (b) { return b.step <= k ? 1 : 0.18; })
      .attr("x", function (b) { return tx(b.start); })
      .attr("width", function (b) { return Math.max(0.5, tx(b.end) - tx(b.start)); });
    bars.exit().remove();
    const now = [wallAfter(tm, k, 0), wallAfter(tm, k, 1)];
    const cur = tcursor.selectAll("line").data(now);
    cur.enter().append("line").attr("stroke", "#d62728").attr("stroke-width", 1.5).merge(cur)
      .attr("y1", function (w, i) { return 28 + i * 54; }).attr("y2", function (w, i) { return 72 + i * 54; })
      .transition().duration(ms).attr("x1", function (w) { return tx(w); }).attr("x2", function (w) { return tx(w); });

    V.clear(side);
    side.appendChild(V.h("p", { class: "viz-caption" }, k < P - 1
      ? "Each device folds the visiting shard into its running (m, l, acc) with ring_step, then sends the shard on; the send of step " + (k + 1) + " overlaps the compute of step " + (k + 2) + "."
      : "Every device has seen every shard: finalize gives its rows' output" + (ref.runs[run].same_as_ring_attention ? ", equal to lab 04's ring_attention." : ".")));
    side.appendChild(V.table(["device", "holds", "m (rows)", "l (rows)"], st.devices.map(function (d) {
      return { attrs: { class: d.masked ? "" : "grew" }, cells: [String(d.device), d.masked ? "KV" + d.holds + " (masked)" : "KV" + d.holds,
        V.num(d.m, 3, { id: "ring-m-" + d.device }), V.num(d.l, 3, { id: "ring-l-" + d.device })] };
    }), { id: "ring-table" }));
    const dl = V.h("dl", { class: "viz-counters", id: "ring-counters" });
    function dt(label, value) { dl.appendChild(V.h("dt", {}, label)); dl.appendChild(V.h("dd", {}, value)); }
    dt("wall time so far, overlapped", [V.num(Number(now[0].toFixed(3)), 1, { id: "ring-wall-now-overlapped" }), " µs"]);
    dt("wall time so far, no overlap", [V.num(Number(now[1].toFixed(3)), 1, { id: "ring-wall-now-sequential" }), " µs"]);
    ["ring overlapped", "ring, no overlap", "all-gather, then compute"].forEach(function (name, i) {
      dt(name + ", whole pass", [V.num(tm.wall_us[name], 1, { id: "ring-wall-" + i }), " µs, K/V held ",
        V.h("span", { class: "num", id: "ring-mem-" + i, "data-value": JSON.stringify(tm.kv_memory[name]) }, V.bytes(tm.kv_memory[name]))]);
    });
    side.appendChild(dl);
    side.appendChild(V.h("p", { id: "ring-hidden", "data-hidden": String(tm.hidden) }, tm.hidden
      ? "At this size a step's compute (" + V.fmt(tm.steps[0].compute_us, 1) + " µs) is longer than its send (" + V.fmt(tm.steps[0].send_us, 1) + " µs): the communication is hidden."
      : "At this size the send (" + V.fmt(tm.steps[0].send_us, 1) + " µs) outlasts the compute (" + V.fmt(tm.steps[0].compute_us, 1) + " µs): the ring waits on the links. Compute grows with the shard squared, the send only linearly."));
  }
  player.go(0);
})();
