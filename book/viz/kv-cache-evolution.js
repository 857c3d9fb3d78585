/* KV cache from MHA to MLA: lab 06's kv_bytes_per_token for the lab's model presets and
 * for the four kinds on the picked preset's shape (traces/lab06-reference.js). Bytes per request are the
 * trace's bytes per token times the context length chosen with the slider. */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("kv-viz");
  const ref = V.trace("lab06-reference");
  const KIND_COLORS = { mha: "#e15759", gqa: "#f28e2b", mqa: "#59a14f", mla: "#4e79a7" };
  const state = { preset: 1, log2ctx: 15 };

  const toolbar = V.h("div", { class: "viz-toolbar" });
  const sel = V.h("select", { id: "kv-preset", "aria-label": "model preset" });
  ref.presets.forEach(function (p, i) {
    const o = V.h("option", { value: i }, p.name);
    if (i === state.preset) o.selected = true;
    sel.appendChild(o);
  });
  sel.addEventListener("change", function () { state.preset = Number(sel.value); render(); });
  toolbar.appendChild(V.h("label", { for: "kv-preset" }, ["Model ", sel]));
  const { input: slider, output: ctxLabel } = V.slider(toolbar, { id: "kv-context", text: "Context ",
    min: 10, max: 20, value: state.log2ctx, label: "context length (tokens, powers of two)" },
    function () { state.log2ctx = Number(slider.value); render(); });
  root.appendChild(toolbar);
  root.appendChild(V.h("p", { class: "viz-caption" },
    "Keys: Tab to a control, then ← / → (slider) or ↑ / ↓ (model)."));
  if (V.reducedMotion()) root.classList.add("reduced-motion");
  const { svg, side } = V.panes(root, "0 0 420 330",
    "bytes of KV cache per token and per request, by attention kind");

  function ctx() { return Math.pow(2, state.log2ctx); }

  function bars(y0, title, items, unit) {
    V.s("text", { x: 10, y: y0, class: "title" }, svg, title);
    const max = Math.max.apply(null, items.map(function (it) { return it.value; }));
    items.forEach(function (it, i) {
      const y = y0 + 10 + i * 24;
      const w = max > 0 ? 250 * it.value / max : 0;
      V.s("text", { x: 10, y: y + 13 }, svg, it.label);
      V.s("rect", { x: 60, y: y, width: Math.max(w, 1), height: 18, fill: it.color, id: it.id,
        "data-value": JSON.stringify(it.value) }, svg);
      V.s("text", { x: 66 + w, y: y + 13 }, svg, unit(it.value));
    });
  }

  function render() {
    V.clear(svg);
    ctxLabel.textContent = " " + V.count(ctx()) + " tokens ";
    // the four kinds on the picked model's own shape: its own kind's bar is its readout
    const p = ref.presets[state.preset], s = p.shape;
    root.setAttribute("data-preset", String(state.preset));
    function kindBars(perRequest) {
      return p.kinds.map(function (k) {
        return { label: k.kind.toUpperCase() + (k.kind === p.kind ? " ◀" : ""),
          value: k.bytes_per_token * (perRequest ? ctx() : 1), color: KIND_COLORS[k.kind],
          id: "kv-bar-" + (perRequest ? "request-" : "") + k.kind };
      });
    }
    bars(18, "Bytes per token, " + p.layers + " layers, " + p.heads + " heads × " + p.head_dim +
      " (◀ this model)", kindBars(false), V.bytes);
    bars(150, "Bytes per request at " + V.count(ctx()) + " tokens", kindBars(true), V.bytes);
    V.legend(svg, 10, 270, [
      { color: KIND_COLORS.mha, label: "MHA: K and V per query head" },
      { color: KIND_COLORS.gqa, label: "GQA: " + s.kv_heads + " K/V heads" },
      { color: KIND_COLORS.mqa, label: "MQA: one K/V head" },
      { color: KIND_COLORS.mla, label: "MLA: one latent row (" + s.kv_lora_rank + " + " + s.rope_dim + ")" },
    ], 400);
    V.clear(side);
    side.appendChild(V.h("h4", {}, p.name));
    const dl = V.h("dl", { class: "viz-counters" });
    function dt(label, value) { dl.appendChild(V.h("dt", {}, label)); dl.appendChild(V.h("dd", {}, value)); }
    dt("kind", p.kind.toUpperCase());
    dt("layers", String(p.layers));
    dt(p.kind === "mla" ? "latent + rope" : "KV heads × head dim",
      p.kind === "mla" ? p.kv_lora_rank + " + " + p.rope_dim
        : (p.kind === "mha" ? p.heads : p.kind === "mqa" ? 1 : p.kv_heads) + " × " + p.head_dim);
    dt("bytes per token", V.num(p.bytes_per_token, 0, { id: "kv-preset-bytes" }));
    dt("", V.bytes(p.bytes_per_token));
    dt("per request (" + V.count(ctx()) + " tokens)", V.h("span", { id: "kv-preset-request" }, V.bytes(p.bytes_per_token * ctx())));
    side.appendChild(dl);
    if (p.window) {
      side.appendChild(V.h("p", {}, "This model's windowed layers keep only the last " + V.count(p.window) +
        " tokens; the per-request figure above counts every layer at the full context (an upper bound)."));
    }
    side.appendChild(V.h("p", { class: "viz-caption" }, "Source: " + p.source + ". bf16 caches (2 bytes per element)."));
  }

  render();
})();
