/* Multi-head self-attention: plays back lab 08's per-head attention_weights and
 * multi_head_attention's head average (the "multihead" part of traces/lab08-reference.js)
 * for causal on/off and padding on/off. Choosing a head or a mask only picks which traced
 * map to draw. Your starter's first difference here when `make trace LAB=08` made one. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("mh-viz");
  const ref = V.trace("lab08-reference").multihead;
  const starter = V.trace("lab08-starter");
  const mine = starter && starter.page_diffs ? Object.assign({}, starter, { first_diff: starter.page_diffs.multihead }) : starter;
  const L = ref.inputs.L, H = ref.inputs.heads;
  const HEAD_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#555"];
  const state = { head: 0, causal: false, padding: false };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  const sel = V.h("select", { id: "mh-head", "aria-label": "head" });
  for (let h = 0; h < H; h++) sel.appendChild(V.h("option", { value: h }, "head " + h));
  sel.appendChild(V.h("option", { value: "avg" }, "average of the heads"));
  sel.addEventListener("change", function () { state.head = sel.value === "avg" ? "avg" : Number(sel.value); render(); });
  toolbar.appendChild(V.h("label", { for: "mh-head" }, ["Show ", sel]));
  [["causal", "Causal mask"], ["padding", "Padding (" + (L - ref.inputs.length) + " tokens)"]].forEach(function (o) {
    const box = V.h("input", { type: "checkbox", id: "mh-" + o[0] });
    box.addEventListener("change", function () { state[o[0]] = box.checked; render(); });
    toolbar.appendChild(V.h("label", { for: "mh-" + o[0] }, [box, " " + o[1]]));
  });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" },
    "Keys: Tab to a control; ↑ / ↓ pick a head, Space toggles a mask; 1–" + H + " pick a head, a the average, c causal, p padding."));
  root.setAttribute("tabindex", "0");
  root.addEventListener("keydown", function (e) {
    if (e.target && /^(INPUT|SELECT)$/.test(e.target.tagName)) return;
    const n = Number(e.key);
    if (n >= 1 && n <= H) { sel.value = String(n - 1); sel.dispatchEvent(new Event("change")); }
    else if (e.key === "a") { sel.value = "avg"; sel.dispatchEvent(new Event("change")); }
    else if (e.key === "c" || e.key === "p") document.getElementById(e.key === "c" ? "mh-causal" : "mh-padding").click();
    else return;
    e.preventDefault();
  });
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 420",
    "attention weight map of the chosen head, queries as rows, keys as columns");
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  const diff = V.starterPanel(wide, "08", mine, function () {
    if (!diff || diff.page !== "multihead") return;
    const parts = diff.run.split("-");
    ["causal", "padding"].forEach(function (name, i) {
      const want = parts[i] === (i === 0 ? "causal" : "padded");
      const box = document.getElementById("mh-" + name);
      if (box.checked !== want) box.click();
    });
    sel.value = String(diff.head);
    sel.dispatchEvent(new Event("change"));
  });

  function run() { return ref.runs[(state.causal ? "causal" : "full") + "-" + (state.padding ? "padded" : "whole")]; }
  function map(r, head) { return head === "avg" ? r.average : r.heads[head]; }
  function shade(w, color) {
    if (typeof w !== "number" || w <= 0) return "#fff";
    return color;
  }

  function render() {
    const r = run(), m = map(r, state.head);
    root.setAttribute("data-run", (state.causal ? "causal" : "full") + "-" + (state.padding ? "padded" : "whole"));
    V.clear(svg);
    const color = HEAD_COLORS[state.head === "avg" ? H : state.head];
    const x0 = 60, y0 = 46, c = 40;
    V.s("text", { x: 10, y: 16, class: "title" }, svg, (state.head === "avg" ? "Average of the " + H + " heads" : "Head " + state.head) +
      ": query i (row) reads key j (column)");
    for (let j = 0; j < L; j++) {
      const pad = r.key_padding_mask && r.key_padding_mask[j];
      V.s("text", { x: x0 + j * c + 10, y: y0 - 8, fill: pad ? "#999" : "#222" }, svg, "k" + j + (pad ? "·" : ""));
    }
    for (let i = 0; i < L; i++) {
      V.s("text", { x: 30, y: y0 + i * c + 24 }, svg, "q" + i);
      for (let j = 0; j < L; j++) {
        const w = m[i][j];
        V.s("rect", { x: x0 + j * c, y: y0 + i * c, width: c - 3, height: c - 3, rx: 3, fill: shade(w, color),
          "fill-opacity": typeof w === "number" ? Math.max(0.08, w) : 1,
          stroke: w === 0 ? "#ccc" : "#999", "stroke-dasharray": w === 0 ? "3 2" : null,
          id: "mh-cell-" + i + "-" + j, "data-value": JSON.stringify(w) }, svg);
        V.s("text", { x: x0 + j * c + 4, y: y0 + i * c + 24, class: "halo" }, svg, w === 0 ? "0" : V.fmt(w, 2));
      }
    }
    // the heads as thumbnails
    const ty = y0 + L * c + 14;
    for (let h = 0; h <= H; h++) {
      const tm = h === H ? r.average : r.heads[h], tx = 20 + h * 78, tc = 9;
      V.s("text", { x: tx, y: ty + 8, "font-weight": (h === H ? "avg" : h) === state.head ? 700 : 400 }, svg, h === H ? "average" : "head " + h);
      for (let i = 0; i < L; i++) for (let j = 0; j < L; j++) {
        V.s("rect", { x: tx + j * tc, y: ty + 12 + i * tc, width: tc - 1, height: tc - 1, fill: HEAD_COLORS[h],
          "fill-opacity": Math.max(0.04, tm[i][j]) }, svg);
      }
    }
    V.legend(svg, 10, ty + 76, [{ color: color, label: "weight (darker = more)" },
      { color: "#fff", stroke: "#ccc", dash: "3 2", label: "masked: weight 0" }], 400);
    V.s("text", { x: 10, y: ty + 106 }, svg, "k· = a padding key (when Padding is on)");
    V.clear(side);
    const dl = V.h("dl", { class: "viz-counters" });
    const sums = m.map(function (row) { return row.reduce(function (a, b) { return a + b; }, 0); });
    [["heads × head dim", H + " × " + (ref.inputs.E / H)],
      ["masks", (state.causal ? "causal" : "none") + (state.padding ? " + padding" : "")],
      ["key_padding_mask", r.key_padding_mask ? V.num(r.key_padding_mask.map(Number), 0, { id: "mh-kpm" }) : "None"],
      ["row sums", V.num(sums, 2, { id: "mh-row-sums" })],
      ["heads average to multi_head_attention's weights", r.heads_average_to_mha ? "yes" : "no"]].forEach(function (p) {
      dl.appendChild(V.h("dt", {}, p[0])); dl.appendChild(V.h("dd", {}, p[1]));
    });
    side.appendChild(dl);
    side.appendChild(V.h("p", {}, state.head === "avg"
      ? "The average is what nn.MultiheadAttention returns by default (average_attn_weights=True): the heads' different patterns blur into one map."
      : "Each head scores its own " + (ref.inputs.E / H) + "-dimensional slice of the projected queries and keys, scaled by 1/√" + (ref.inputs.E / H) +
        ", so the heads attend to different keys from the same tokens."));
    if (state.padding) side.appendChild(V.h("p", {}, "Padding hides keys, not queries: the padded tokens' own rows still attend to the real keys; their outputs are simply ignored later."));
  }
  render();
})();
