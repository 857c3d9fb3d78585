/* Split-KV merge: plays back lab 04's trace (partial_state per partition, merge in three
 * orders, finalize) and your starter's when `make trace LAB=04` made one. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("split-viz");
  const ref = V.trace("lab04-reference");
  const mine = V.trace("lab04-starter");
  const P = ref.partitions.length;
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"];
  let order = "tree";

  const toolbar = V.h("div", { class: "viz-toolbar" });
  Object.keys(ref.orders).forEach(function (name) {
    const id = "split-order-" + name;
    const r = V.h("input", { type: "radio", name: "split-order", id: id, value: name });
    if (name === order) r.checked = true;
    r.addEventListener("change", function () { order = name; player.reset(steps()); });
    toolbar.appendChild(V.h("label", { for: id }, [r, " " + name]));
  });
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: 0, render: render, name: "split" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 400",
    "keys cut into partitions and the merge tree of their states");
  const caption = V.h("p", { class: "viz-caption", id: "split-caption" });
  side.appendChild(caption);
  const stateBox = V.h("div", { id: "split-state" });
  side.appendChild(stateBox);
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  wide.appendChild(V.h("h4", {}, "Every order, the same answer"));
  const finals = V.h("div", { id: "split-finals" });
  wide.appendChild(finals);
  const diff = V.starterPanel(wide, "04", mine, function (k) {
    if (diff && diff.order && diff.order !== order) document.getElementById("split-order-" + diff.order).click();
    player.go(diff && diff.order ? k - P + 1 : 0);
  });

  function steps() { return ref.orders[order].merges.length + 2; }

  // keys as score bars, coloured by partition
  V.s("text", { x: 10, y: 16, class: "title" }, svg, "Scores of one decode query against " + ref.scores.length + " keys");
  const maxAbs = Math.max.apply(null, ref.scores.map(Math.abs));
  ref.scores.forEach(function (s, j) {
    const part = ref.bounds.findIndex(function (b) { return j >= b[0] && j < b[1]; });
    const h = 40 * Math.abs(s) / maxAbs;
    V.s("rect", { x: 20 + j * 32, y: s >= 0 ? 70 - h : 70, width: 26, height: Math.max(h, 1), fill: COLORS[part] }, svg);
  });
  V.s("line", { x1: 16, x2: 410, y1: 70, y2: 70, stroke: "#666" }, svg);
  ref.bounds.forEach(function (b, i) {
    V.s("text", { x: 20 + b[0] * 32 + 30, y: 128, fill: COLORS[i] }, svg, "P" + i + ": keys " + b[0] + "–" + (b[1] - 1));
  });
  const tree = V.s("g", {}, svg);
  V.legend(svg, 10, 360, ref.bounds.map(function (b, i) { return { color: COLORS[i], label: "partition P" + i }; })
    .concat([{ color: "#fff", stroke: "#333", label: "merged state (m, l)" }]), 400);

  function node(x, y, label, st, color, id) {
    const g = V.s("g", { id: id }, tree);
    V.s("rect", { x: x - 44, y: y - 16, width: 88, height: 34, rx: 6, fill: "#fff", stroke: color, "stroke-width": 2 }, g);
    V.s("text", { x: x - 40, y: y - 3 }, g, label);
    V.s("text", { x: x - 40, y: y + 12 }, g, st ? "m " + V.fmt(st.m, 2) + " l " + V.fmt(st.l, 2) : "—");
    return g;
  }

  function render(k) {
    V.clear(tree);
    const o = ref.orders[order];
    const pos = {};
    ref.partitions.forEach(function (st, i) {
      pos["P" + i] = { x: 60 + i * 100, y: 160 };
      node(pos["P" + i].x, 160, "P" + i, st, COLORS[i], "split-node-P" + i);
    });
    const shown = Math.min(k, o.merges.length);
    const rows = ref.partitions.map(function (st, i) {
      return { cells: ["P" + i, V.num(st.m, 4, { id: "split-m-P" + i }), V.num(st.l, 4), V.num(st.acc, 3)] };
    });
    for (let j = 0; j < shown; j++) {
      const mg = o.merges[j];
      const a = pos[mg.a], b = pos[mg.b];
      const y = Math.max(a.y, b.y) + 55, x = (a.x + b.x) / 2;
      pos[mg.a + "+" + mg.b] = { x: x, y: y };
      [a, b].forEach(function (p) { V.s("line", { x1: p.x, y1: p.y + 18, x2: x, y2: y - 16, stroke: "#888" }, tree); });
      node(x, y, mg.label.length > 13 ? "merge " + (j + 1) : mg.label, mg.state, "#333", "split-node-m" + j);
      const differs = diff && diff.order === order && diff.step === P + j;
      rows.push({ attrs: { class: differs ? "differs" : "" },
        cells: [mg.label, V.num(mg.state.m, 4, { id: "split-m-" + j }), V.num(mg.state.l, 4, { id: "split-l-" + j }),
          V.num(mg.state.acc, 3, { id: "split-acc-" + j })] });
    }
    V.clear(stateBox).appendChild(V.table(["state", "m", "l", "acc"], rows, { id: "split-table" }));
    caption.textContent = k === 0 ? "Each partition's state (m, l, acc) is computed on its own (partial_state), anywhere."
      : k <= o.merges.length ? "merge " + k + ": rescale both sides to the larger m, then add l and acc."
        : "finalize: out = acc / l, lse = m + log l.";
    V.clear(finals);
    if (k > o.merges.length) {
      const names = Object.keys(ref.orders);
      const base = ref.orders[names[0]];
      const rowsF = names.map(function (n) {
        const f = ref.orders[n];
        const dev = Math.max.apply(null, f.out.map(function (x, i) { return Math.abs(x - base.out[i]); }));
        return { attrs: { class: n === order ? "grew" : "" },
          cells: [n, V.num(f.out, 6, { id: "split-out-" + n }), V.num(f.lse, 6, { id: "split-lse-" + n }),
            dev.toExponential(1)] };
      });
      finals.appendChild(V.table(["order", "out", "lse", "max |Δout| vs " + names[0]], rowsF));
    } else {
      finals.appendChild(V.h("p", {}, "Step to the end to see the finished output of every merge order."));
    }
  }

  player.reset(steps());
})();
