/* LSH attention bucketing: lab 10's lsh_buckets on 16 two-dimensional vectors, per round,
 * and, for 1..R rounds, lsh_mass_captured and lsh_attention's error per query
 * (the "lsh" part of traces/lab10-reference.js). Which keys share a bucket is read off the
 * traced bucket ids. Your starter's first difference when `make trace LAB=10` made one.
 * The hash's regions (lsh_buckets on unit vectors a degree apart, "regions") are wedges
 * under the points; a D3 transition turns them from one round's rotation to the next's. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("lsh-viz");
  const ref = V.trace("lab10-reference").lsh;
  const starter = V.trace("lab10-starter");
  const mine = starter && starter.page_diffs ? Object.assign({}, starter, { first_diff: starter.page_diffs.lsh }) : starter;
  const n = ref.inputs.n, R = ref.inputs.rounds;
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2"];
  const state = { rounds: 1, query: 0 };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  const { input: rIn, output: rOut } = V.slider(toolbar, { id: "lsh-rounds", text: "Rounds ",
    min: 1, max: R, value: state.rounds, label: "hashing rounds" },
    function () { state.rounds = Number(rIn.value); render(); });
  const { input: qIn, output: qOut } = V.slider(toolbar, { id: "lsh-query", text: "Query ",
    min: 0, max: n - 1, value: state.query, label: "query" },
    function () { state.query = Number(qIn.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" }, "Keys: Tab to a slider, then ← / →; or click a point to make it the query."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 400",
    "16 vectors in the plane coloured by bucket, and the keys the chosen query attends");
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  V.starterPanel(wide, "10", mine, function (k) { rIn.value = k + 1; state.rounds = k + 1; render(); });

  // the hash regions, kept across renders so that they can turn
  const cx = 150, cy = 180, RAD = 128;
  const wedges = d3.select(svg).append("g").attr("class", "lsh-regions").attr("id", "lsh-regions");
  let shownRound = null;
  function wedgePath(a0, a1) {
    const p = function (a) { const t = a * Math.PI / 180; return (cx + RAD * Math.cos(t)) + "," + (cy - RAD * Math.sin(t)); };
    return "M" + cx + "," + cy + " L" + p(a0) + " A" + RAD + "," + RAD + " 0 " + (a1 - a0 > 180 ? 1 : 0) + " 0 " + p(a1) + " Z";
  }
  function drawRegions(round) {
    if (!ref.regions) return;
    const ms = V.reducedMotion() || shownRound === null ? 0 : 700;
    const old = {};
    wedges.selectAll("path").each(function (d) { old[d.bucket] = d; });
    const data = ref.regions[round].map(function (r) {
      const o = old[r.bucket];
      let shift = 0;  // turn the short way round
      if (o) { while (r.from + shift - o.from > 180) shift -= 360; while (o.from - (r.from + shift) > 180) shift += 360; }
      return { bucket: r.bucket, from: r.from + shift, to: r.to + shift };
    });
    const paths = wedges.selectAll("path").data(data, function (d) { return d.bucket; });
    paths.exit().remove();
    paths.enter().append("path").attr("fill-opacity", 0.16).attr("stroke", "none")
      .attr("d", function (d) { return wedgePath(d.from, d.to); })
      .merge(paths)
      .attr("id", function (d) { return "lsh-region-" + d.bucket; })
      .attr("data-from", function (d) { return ((d.from % 360) + 360) % 360; })
      .attr("fill", function (d) { return COLORS[d.bucket]; })
      .transition().duration(ms)
      .attrTween("d", function (d) {
        const o = old[d.bucket] || d;
        const f = d3.interpolateNumber(o.from, d.from), t = d3.interpolateNumber(o.to, d.to);
        return function (u) { return wedgePath(f(u), t(u)); };
      });
    wedges.attr("data-round", String(round + 1));
    shownRound = round;
  }

  function attended(q) { // keys sharing q's bucket in any of the first `rounds` rounds
    const keys = [];
    for (let j = 0; j < n; j++) {
      for (let r = 0; r < state.rounds; r++) if (ref.buckets[r][j] === ref.buckets[r][q]) { keys.push(j); break; }
    }
    return keys;
  }

  function render() {
    rOut.textContent = " " + state.rounds + " ";
    qOut.textContent = " " + state.query + " ";
    const q = state.query, keys = attended(q), last = state.rounds - 1;
    root.setAttribute("data-query", String(q));
    Array.prototype.slice.call(svg.childNodes).forEach(function (c) { if (c !== wedges.node()) svg.removeChild(c); });
    drawRegions(last);
    V.s("text", { x: 10, y: 16, class: "title" }, svg, "Colour = bucket in round " + state.rounds + "; ringed = keys query " + q + " attends");
    const sc = 36;
    V.s("line", { x1: cx - 140, x2: cx + 140, y1: cy, y2: cy, stroke: "#ddd" }, svg);
    V.s("line", { x1: cx, x2: cx, y1: cy - 140, y2: cy + 140, stroke: "#ddd" }, svg);
    const labels = [];
    ref.x.forEach(function (p, j) {
      const x = cx + p[0] * sc, y = cy - p[1] * sc, b = ref.buckets[last][j];
      const inSet = keys.indexOf(j) >= 0;
      V.s("line", { x1: cx, y1: cy, x2: x, y2: y, stroke: COLORS[b], "stroke-opacity": 0.35 }, svg);
      const dot = V.s("circle", { cx: x, cy: y, r: j === q ? 9 : 6, fill: COLORS[b], stroke: inSet ? "#222" : "none",
        "stroke-width": 2, id: "lsh-point-" + j, "data-bucket": b, "data-attended": inSet ? "true" : "false",
        style: "cursor: pointer" }, svg);
      dot.addEventListener("click", function () { state.query = j; qIn.value = j; render(); });
      // the label sits outside the point, along its direction from the origin, on a halo
      // (or inside, when a label already sits there: two vectors can nearly coincide)
      const len = Math.hypot(p[0], p[1]) || 1, ux = p[0] / len, uy = -p[1] / len;
      let lx = x + ux * 16, ly = y + uy * 16;
      if (labels.some(function (o) { return Math.abs(o[0] - lx) < 16 && Math.abs(o[1] - ly) < 13; })) {
        lx = x - ux * 16; ly = y - uy * 16;
      }
      labels.push([lx, ly]);
      V.s("text", { x: lx, y: ly + 4, "text-anchor": "middle", class: "halo",
        "font-weight": j === q ? 700 : 400 }, svg, String(j));
    });
    // bucket ids per round, as rows
    const ty = 330;
    V.s("text", { x: 10, y: ty - 6 }, svg, "bucket of each vector, round by round");
    for (let r = 0; r < R; r++) {
      V.s("text", { x: 10, y: ty + r * 16 + 11, fill: r < state.rounds ? "#222" : "#aaa" }, svg, "r" + (r + 1));
      for (let j = 0; j < n; j++) {
        V.s("rect", { x: 34 + j * 23, y: ty + r * 16, width: 21, height: 13, fill: COLORS[ref.buckets[r][j]],
          "fill-opacity": r < state.rounds ? 1 : 0.2, stroke: j === q ? "#222" : "none" }, svg);
      }
    }
    V.legend(svg, 290, 40, ref.buckets.length ? [0, 1, 2, 3].slice(0, ref.inputs.n_buckets).map(function (b) {
      return { color: COLORS[b], label: "bucket " + b };
    }) : [], 120);
    const br = ref.by_rounds[state.rounds - 1];
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    [["keys attended", V.num(keys.length, 0, { id: "lsh-keys" })], ["of", String(n)],
      ["softmax mass captured (lsh_mass_captured)", V.num(br.mass[q], 4, { id: "lsh-mass" })],
      ["lsh_attention's relative error", V.num(br.error[q], 4, { id: "lsh-error" })]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("h4", {}, "Every query, " + state.rounds + " round" + (state.rounds > 1 ? "s" : "")));
    side.appendChild(V.table(["query", "mass", "error"], br.mass.map(function (m, i) {
      return { attrs: { class: i === q ? "grew" : "" }, cells: [String(i), V.num(m, 3), V.num(br.error[i], 3)] };
    }), { id: "lsh-table" }));
    side.appendChild(V.h("p", {}, "A round hashes each vector to argmax([x R, −x R]) for a random R: vectors at a small angle " +
      "tend to share a bucket. A query near a bucket's edge loses neighbours on the other side; another round, with " +
      "another R, often catches them, so the mass captured grows with the rounds."));
  }
  render();
})();
