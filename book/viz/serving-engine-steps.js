/* Serving engine steps: plays back lab 11's trace (traces/lab11-*.js): each step's batch
 * (prefill chunks, decode rows and recomputes, coloured by request), the block pool and
 * every block table after the step, preemptions and prefix-cache hits; and your starter's
 * first difference when `make trace LAB=11` made one. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("engine-viz");
  const ref = V.trace("lab11-reference");
  const mine = V.trace("lab11-starter");
  const E = ref.engine;
  const PALETTE = [["#c6dbef", "#2b5d8f"], ["#fdd0a2", "#9a4a00"], ["#c7e9c0", "#2d6e2d"],
    ["#f7c6c7", "#a82020"], ["#dadaeb", "#54278f"], ["#f0e0a0", "#6b5800"]];
  const COLOR = {};
  ref.requests.forEach(function (r, i) { COLOR[r.request] = PALETTE[i % PALETTE.length]; });
  const KIND = { prefill: "prefill chunk", decode: "decode row", recompute: "recompute (after preemption)" };
  const jumps = { preempt: [], hit: [] };
  ref.steps.forEach(function (st, n) {
    if (st.preempted.length) jumps.preempt.push(n);
    if (st.rows.some(function (r) { return r.cached > 0; })) jumps.hit.push(n);
  });

  const toolbar = V.h("div", { class: "viz-toolbar" });
  [["preempt", "Next preemption"], ["hit", "Next prefix hit"]].forEach(function (j) {
    const b = V.h("button", { type: "button", id: "engine-next-" + j[0], "data-action": "next-" + j[0] }, j[1]);
    b.addEventListener("click", function () {
      const next = jumps[j[0]].find(function (n) { return n > player.step; });
      player.go(next === undefined ? jumps[j[0]][0] : next);
    });
    toolbar.appendChild(b);
  });
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: ref.steps.length, render: render, name: "engine" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 480 420",
    "one engine step: the batch by request, the block pool and every block table");
  const caption = V.h("p", { class: "viz-caption", id: "engine-caption" });
  side.appendChild(caption);
  const counters = V.h("dl", { class: "viz-counters", id: "engine-counters" });
  side.appendChild(counters);
  const rowsBox = V.h("div", { id: "engine-rows" });
  side.appendChild(rowsBox);
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  const diff = V.starterPanel(wide, "11", mine, function (k) { player.go(k); });
  const layer = V.s("g", {}, svg);
  const legend = [{ color: "#ffffff", stroke: "#555", label: "unused budget" },
    { color: "#e8e8e8", label: "free block" },
    { color: "#ffffff", stroke: "#222", dash: "3,2", label: "prefix hit / recompute" }];
  V.legend(svg, 10, 384, ref.requests.map(function (r) {
    return { color: COLOR[r.request][0], stroke: COLOR[r.request][1], label: "request " + r.request };
  }).concat(legend), 460);

  function dt(label, value, id) {
    counters.appendChild(V.h("dt", {}, label));
    counters.appendChild(V.h("dd", {}, V.num(value, 0, { id: id })));
  }

  function owners(st) {
    const by = {};
    Object.keys(st.tables).forEach(function (rid) {
      (st.tables[rid] || []).forEach(function (b) { (by[b] = by[b] || []).push(rid); });
    });
    return by;
  }

  function render(k) {
    const st = ref.steps[k];
    const prev = k > 0 ? ref.steps[k - 1] : { tables: {} };
    V.clear(layer);
    // 1. the batch: one cell per scheduled token, in batch order, under the token budget
    V.s("text", { x: 10, y: 16, class: "title" }, layer,
      "The batch: " + st.positions.length + " of " + E.max_num_batched_tokens + " budget tokens");
    const cw = 56;
    let t = 0;
    st.rows.forEach(function (row, r) {
      const c = COLOR[row.request];
      for (let i = 0; i < row.tokens; i++, t++) {
        const x = 10 + t * cw;
        V.s("rect", { x: x, y: 26, width: cw - 4, height: 26, rx: 3, fill: c[0], stroke: c[1],
          "stroke-width": row.kind === "decode" ? 2.5 : 1.2,
          "stroke-dasharray": row.kind === "recompute" || (row.cached && i === 0) ? "3,2" : null,
          id: "engine-tok-" + t, "data-request": row.request }, layer);
        V.s("text", { x: x + 6, y: 43 }, layer, row.request + " @" + st.positions[t]);
      }
      const from = 10 + (t - row.tokens) * cw;
      V.s("text", { x: from + 2, y: 66 + (r % 2) * 13, class: "legend-label" }, layer,
        row.tokens > 1 ? row.request + " " + row.kind + " " + row.start + "–" + (row.start + row.tokens - 1)
          : row.request + " " + row.kind.slice(0, 3));
    });
    for (; t < E.max_num_batched_tokens; t++) {
      V.s("rect", { x: 10 + t * cw, y: 26, width: cw - 4, height: 26, rx: 3, fill: "#ffffff", stroke: "#999",
        "stroke-dasharray": "2,2" }, layer);
    }
    // 2. the block pool after the step
    V.s("text", { x: 10, y: 106, class: "title" }, layer,
      "Block pool: " + st.free_blocks + " of " + E.num_blocks + " free (" + E.block_size + " slots each)");
    const by = owners(st);
    const was = owners(prev);
    const bw = 51;
    for (let b = 0; b < E.num_blocks; b++) {
      const x = 10 + b * bw, who = by[b] || [];
      const fill = who.length ? COLOR[who[0]][0] : "#e8e8e8";
      const fresh = who.some(function (rid) { return (was[b] || []).indexOf(rid) < 0; });
      V.s("rect", { x: x, y: 114, width: bw - 5, height: 40, rx: 4, fill: fill, id: "engine-block-" + b,
        stroke: who.length ? COLOR[who[0]][1] : "#999", "stroke-width": fresh ? 2.5 : 1 }, layer);
      V.s("text", { x: x + 5, y: 129 }, layer, "block " + b);
      V.s("text", { x: x + 5, y: 146 }, layer, who.length ? who.join(" ") : "free");
    }
    // 3. every block table after the step
    V.s("text", { x: 10, y: 184, class: "title" }, layer, "Block tables (new entries this step: bold)");
    const hits = {};
    st.rows.forEach(function (row) { if (row.cached) hits[row.request] = row.cached / E.block_size; });
    Object.keys(st.tables).forEach(function (rid, r) {
      const y = 194 + r * 32, c = COLOR[rid];
      V.s("text", { x: 12, y: y + 17, class: "title" }, layer, rid);
      const before = prev.tables[rid] || [];
      const renewed = st.rows.some(function (row) { return row.request === rid && row.new; });
      st.tables[rid].forEach(function (b, j) {
        const x = 30 + j * 44;
        const isNew = renewed || j >= before.length || before[j] !== b;
        V.s("rect", { x: x, y: y, width: 38, height: 24, rx: 3, fill: c[0], stroke: c[1],
          "stroke-width": isNew ? 2.5 : 1, "stroke-dasharray": j < (hits[rid] || 0) ? "3,2" : null,
          id: "engine-entry-" + rid + "-" + j }, layer);
        V.s("text", { x: x + 13, y: y + 16 }, layer, String(b));
      });
      if (hits[rid]) {
        V.s("text", { x: 36 + st.tables[rid].length * 44, y: y + 16, class: "legend-label" }, layer,
          hits[rid] + " blocks from the prefix cache");
      }
    });
    // 4. the queue
    const y4 = 194 + Math.max(1, Object.keys(st.tables).length) * 32 + 14;
    V.s("text", { x: 10, y: Math.min(y4, 360), id: "engine-queue" }, layer,
      (st.preempted.length ? "Preempted: " + st.preempted.join(", ") + " (blocks freed; recomputed later). " : "") +
      "Waiting: " + (st.waiting.length ? st.waiting.join(", ") : "none"));

    V.clear(counters);
    dt("tokens this step", st.positions.length, "engine-tokens");
    dt("free blocks", st.free_blocks, "engine-free");
    dt("prefix-hit tokens", st.rows.reduce(function (a, r) { return a + r.cached; }, 0), "engine-hit");
    dt("running", Object.keys(st.tables).length, "engine-running");
    counters.appendChild(V.h("dt", {}, "preempted"));
    counters.appendChild(V.h("dd", { id: "engine-preempted", "data-value": JSON.stringify(st.preempted) },
      st.preempted.length ? st.preempted.join(", ") : "—"));
    counters.appendChild(V.h("dt", {}, "whole run: prompt tokens from the cache"));
    counters.appendChild(V.h("dd", {}, [V.num(ref.hit_tokens, 0, { id: "engine-hit-total" }), " of ",
      V.num(ref.lookup_tokens, 0, { id: "engine-lookup-total" })]));

    const rows = st.rows.map(function (row, r) {
      const a = st.positions.slice(0), start = st.rows.slice(0, r).reduce(function (s, q) { return s + q.tokens; }, 0);
      const slots = st.slots.slice(start, start + row.tokens);
      return { attrs: { class: diff && diff.step === k ? "differs" : "", id: "engine-row-" + r,
        "data-request": row.request, "data-kind": row.kind },
      cells: [row.request, KIND[row.kind], V.num(a.slice(start, start + row.tokens), 0, { id: "engine-pos-" + r }),
        V.num(slots, 0, { id: "engine-slots-" + r }),
        row.request in st.sampled ? V.num(st.sampled[row.request], 0, { id: "engine-sampled-" + r }) : "—"] };
    });
    V.clear(rowsBox).appendChild(V.table(["req", "row", "positions", "slots", "sampled"], rows,
      { id: "engine-table" }));
    const arrived = st.arrivals.length ? st.arrivals.join(", ") + (st.arrivals.length > 1 ? " arrive. " : " arrives. ") : "";
    const said = st.rows.map(function (row) {
      const hit = row.cached ? " (its first " + row.cached + " tokens are prefix-cache hits)" : "";
      if (row.kind === "decode") return "";
      if (row.kind === "recompute") return row.request + " is recomputed from position " + row.start + hit + ". ";
      return row.request + (row.start && !row.cached ? "'s prefill continues at position " : " prefills from position ") +
        row.start + hit + ". ";
    }).join("");
    const decodes = st.rows.filter(function (row) { return row.kind === "decode"; }).map(function (row) { return row.request; });
    caption.textContent = "Step " + (k + 1) + ": " + arrived + said +
      (decodes.length ? "Decode rows first: " + decodes.join(", ") + ". " : "") +
      (st.preempted.length ? "The pool ran out: " + st.preempted.join(", ") + " lost its blocks and waits to be recomputed. "
        : "") +
      (st.finished.length ? st.finished.join(", ") + " finished; its blocks are free again." : "");
  }

  player.reset(ref.steps.length);
})();
