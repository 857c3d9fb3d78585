/* FlashAttention tiling: plays back lab 00's trace (traces/lab00-reference.js) and, when
 * `make trace LAB=00` made one, your starter's (traces/lab00-starter.js) beside it. D3
 * transitions move each step's Q and K/V tiles from their strips into the SRAM box and slide
 * the score tile's outline; both schedules' HBM traffic side by side on one bar length.
 * (d3-core only: selections and transitions; the page has no axis.) */
(function () {
  "use strict";
  const V = window.Viz;
  const root = document.getElementById("fa-viz");
  const ref = V.trace("lab00-reference");
  const mine = V.trace("lab00-starter");
  const inp = ref.inputs;
  const L = inp.L, T = inp.tile, NT = L / T;
  const CELL = 18, GX = 86, GY = 78;
  let mode = "flash";

  // ---- the page's skeleton
  const toolbar = V.h("div", { class: "viz-toolbar" });
  ["standard", "flash"].forEach(function (m) {
    const id = "fa-mode-" + m;
    const r = V.h("input", { type: "radio", name: "fa-mode", id: id, value: m });
    if (m === mode) r.checked = true;
    r.addEventListener("change", function () { mode = m; player.reset(steps()); });
    toolbar.appendChild(V.h("label", { for: id }, [r, m === "flash" ? " FlashAttention (tiled, fused)" : " Standard attention (3 kernels)"]));
  });
  root.appendChild(toolbar);
  const player = new V.Player(root, { steps: ref.steps.length, render: render, name: "fa" });
  root.appendChild(player.bar);
  const { svg, side } = V.panes(root, "0 0 420 540",
    "score matrix tiles, which are in SRAM, and the HBM");
  const caption = V.h("p", { class: "viz-caption", id: "fa-caption" });
  side.appendChild(caption);
  const counters = V.h("dl", { class: "viz-counters", id: "fa-counters" });
  side.appendChild(counters);
  const formula = V.h("div", { class: "viz-formula", id: "fa-formula" });
  side.appendChild(V.h("h4", {}, "The rescale, for one row"));
  side.appendChild(formula);
  const wide = V.h("div", { class: "viz-wide" });
  root.appendChild(wide);
  wide.appendChild(V.h("h4", {}, "Running state of the Q tile's rows"));
  const tableBox = V.h("div", { id: "fa-table" });
  wide.appendChild(tableBox);
  const diff = V.starterPanel(wide, "00", mine, function (k) {
    if (mode !== "flash") { document.getElementById("fa-mode-flash").click(); }
    player.go(k);
  });

  // ---- static SVG: grid cells, tile strips, memory boxes, legend
  V.s("text", { x: GX, y: 14, class: "title" }, svg, "Scores S = Q Kᵀ · scale  (" + L + "×" + L + ", tiles of " + T + ")");
  const cells = [];
  for (let i = 0; i < L; i++) {
    cells.push([]);
    for (let j = 0; j < L; j++) {
      cells[i].push(V.s("rect", { x: GX + j * CELL, y: GY + i * CELL, width: CELL - 1, height: CELL - 1,
        fill: "#fff", stroke: "#ccc", "stroke-width": 0.5 }, svg));
    }
  }
  const qStrip = [], kStrip = [];
  for (let t = 0; t < NT; t++) {
    qStrip.push(V.s("rect", { x: GX - 40, y: GY + t * T * CELL, width: 30, height: T * CELL - 3, rx: 3 }, svg));
    V.s("text", { x: GX - 36, y: GY + t * T * CELL + T * CELL / 2 + 4, class: "halo" }, svg, "Q" + t);
    kStrip.push(V.s("rect", { x: GX + t * T * CELL, y: GY - 40, width: T * CELL - 3, height: 30, rx: 3 }, svg));
    V.s("text", { x: GX + t * T * CELL + 14, y: GY - 21, class: "halo" }, svg, "K" + t + " V" + t);
  }
  const rowMark = V.s("rect", { x: GX - 2, y: 0, width: L * CELL + 3, height: CELL + 1, fill: "none",
    stroke: "var(--viz-bad, #d62728)", "stroke-width": 2.5, opacity: 0 }, svg);
  const by = GY + L * CELL + 14;
  V.s("rect", { x: 10, y: by, width: 196, height: 80, rx: 5, fill: "#fff7ec", stroke: "#f28e2b" }, svg);
  V.s("text", { x: 18, y: by + 16, class: "title" }, svg, "SRAM (on chip, small)");
  const sramText = V.s("text", { x: 18, y: by + 36 }, svg, "");
  const sramText2 = V.s("text", { x: 18, y: by + 52 }, svg, "");
  V.s("rect", { x: 214, y: by, width: 200, height: 80, rx: 5, fill: "#f4effa", stroke: "#9467bd" }, svg);
  V.s("text", { x: 220, y: by + 16, class: "title" }, svg, "HBM (off chip, GBs)");
  const hbmText = V.s("text", { x: 220, y: by + 36 }, svg, "");
  const hbmText2 = V.s("text", { x: 220, y: by + 52 }, svg, "");
  V.legend(svg, 10, by + 92, [
    { color: "#f28e2b", label: "tile in SRAM now" },
    { color: "#c9d3df", label: "done: used, then discarded" },
    { color: "#9467bd", label: "written to HBM (L×L)" },
    { color: "#ffffff", label: "not yet" },
    { color: "#fff", stroke: "#d62728", label: "your first difference" },
  ], 400);

  // the tiles that travel into SRAM at each step, and the score tile's outline
  const g = d3.select(svg);
  const tileBox = g.append("rect").attr("id", "fa-tile-box").attr("fill", "none").attr("stroke", "#333")
    .attr("stroke-width", 2).attr("x", GX - 1).attr("y", GY - 1).attr("width", T * CELL + 1).attr("height", T * CELL + 1);
  const slots = { q: [18, by + 60, 30, 14], kv: [54, by + 60, 44, 14] };
  const movers = {};
  ["q", "kv"].forEach(function (m) {
    movers[m] = g.append("g").attr("class", "fa-mover").attr("id", "fa-mover-" + m);
    movers[m].append("rect").attr("rx", 2).attr("fill", "#f28e2b").attr("stroke", "#a65a12");
  });
  let last = null;
  function fly(m, from, to, moved, ms) {
    const r = movers[m].select("rect");
    r.interrupt();
    if (!moved) { r.attr("x", to[0]).attr("y", to[1]).attr("width", to[2]).attr("height", to[3]); return; }
    r.attr("x", from[0]).attr("y", from[1]).attr("width", from[2]).attr("height", from[3]).attr("opacity", 0.9)
      .transition().duration(ms).ease(d3.easeCubicInOut)
      .attr("x", to[0]).attr("y", to[1]).attr("width", to[2]).attr("height", to[3]).attr("opacity", 1);
  }
  // HBM traffic of both schedules, side by side on one D3 scale
  const meterBox = V.h("div", { class: "viz-meter" });
  side.insertBefore(meterBox, side.firstChild.nextSibling);
  const msvg = d3.select(meterBox).append("svg").attr("class", "viz-svg").attr("viewBox", "0 0 300 84")
    .attr("role", "img").attr("aria-label", "HBM traffic of FlashAttention and of standard attention");
  const stdTotalBytes = ref.standard[ref.standard.length - 1].hbm_total;
  const mx = function (b) { return 120 * b / stdTotalBytes; };  // bytes -> bar length
  msvg.append("text").attr("x", 4).attr("y", 12).attr("class", "title").text("HBM traffic so far");
  const meterNames = [], meterValues = [];
  const meters = [["flash", "FlashAttention"], ["standard", "Standard"]].map(function (m, i) {
    msvg.append("text").attr("x", 4).attr("y", 34 + i * 26).text(m[1]);
    meterNames.push(msvg.append("text").attr("x", 4).attr("y", 46 + i * 26).attr("class", "legend-label"));
    msvg.append("rect").attr("x", 96).attr("y", 24 + i * 26).attr("width", 120).attr("height", 14).attr("fill", "#eee");
    meterValues.push(msvg.append("text").attr("x", 222).attr("y", 35 + i * 26).attr("id", "fa-meter-text-" + m[0]));
    return msvg.append("rect").attr("id", "fa-meter-" + m[0]).attr("x", 96).attr("y", 24 + i * 26)
      .attr("height", 14).attr("width", 0).attr("fill", m[0] === "flash" ? "#2ca02c" : "#9467bd");
  });
  function meter(flashBytes, stdBytes, flashWhen, stdWhen) {
    const ms = V.reducedMotion() ? 0 : 400;
    [flashBytes, stdBytes].forEach(function (b, i) {
      meters[i].attr("data-value", b).transition().duration(ms).attr("width", mx(b));
      meterValues[i].text(V.bytes(b));
      meterNames[i].text([flashWhen, stdWhen][i]);
    });
  }

  function steps() { return mode === "flash" ? ref.steps.length : ref.standard.length; }

  function dt(label, value, id) {
    counters.appendChild(V.h("dt", {}, label));
    counters.appendChild(V.h("dd", { id: id }, value));
  }

  function render(k) {
    if (mode === "flash") renderFlash(k); else renderStandard(k);
  }

  function renderFlash(k) {
    const st = ref.steps[k];
    const lastK = st.kt === NT - 1;
    for (let i = 0; i < L; i++) {
      const qt = Math.floor(i / T);
      for (let j = 0; j < L; j++) {
        const kt = Math.floor(j / T);
        const past = qt < st.qt || (qt === st.qt && kt < st.kt);
        const now = qt === st.qt && kt === st.kt;
        cells[i][j].setAttribute("fill", now ? "#f28e2b" : past ? "#c9d3df" : "#ffffff");
      }
    }
    qStrip.forEach(function (r, t) { r.setAttribute("fill", t === st.qt ? "#f28e2b" : "#eee"); });
    kStrip.forEach(function (r, t) { r.setAttribute("fill", t === st.kt ? "#f28e2b" : "#eee"); });
    const ms = V.reducedMotion() ? 0 : 650;
    fly("q", [GX - 40, GY + st.qt * T * CELL, 30, T * CELL - 3], slots.q, !last || last.qt !== st.qt || last.mode !== "flash", ms);
    fly("kv", [GX + st.kt * T * CELL, GY - 40, T * CELL - 3, 30], slots.kv, true, ms);
    movers.q.attr("opacity", 1); movers.kv.attr("opacity", 1);
    tileBox.attr("opacity", 1).transition().duration(ms / 2).attr("x", GX + st.kt * T * CELL - 1).attr("y", GY + st.qt * T * CELL - 1)
      .attr("width", T * CELL + 1).attr("height", T * CELL + 1);
    last = { qt: st.qt, mode: "flash" };
    meter(st.hbm, stdTotalBytes, "so far", "whole run");
    sramText.textContent = "Q" + st.qt + " (" + T + "×" + inp.d + "), K" + st.kt + ", V" + st.kt + ", S tile " + T + "×" + T;
    sramText2.textContent = "m, l, acc of " + T + " rows" + (lastK ? " → O = acc / l" : "");
    hbmText.textContent = "Q, K, V (read), O and lse (written)";
    hbmText2.textContent = "the " + L + "×" + L + " S and P: never";
    caption.textContent = "Q tile " + st.qt + " against K/V tile " + st.kt + ": a " + T + "×" + T +
      " score tile lives only in SRAM; m, l, acc absorb it" + (lastK ? ", and the Q tile's output is written once." : ".");
    V.clear(counters);
    dt("HBM traffic", V.bytes(st.hbm), "fa-hbm");
    dt("FLOPs (Q Kᵀ and P V)", V.count(st.flops), "fa-flops");
    const stdTotal = ref.standard[ref.standard.length - 1].hbm_total;
    dt("Standard, whole run", V.bytes(stdTotal), "fa-std-total");
    document.getElementById("fa-hbm").setAttribute("data-value", String(st.hbm));
    document.getElementById("fa-flops").setAttribute("data-value", String(st.flops));
    // the rows of this Q tile
    const prev = st.kt > 0 ? ref.steps[k - 1] : null;
    const yours = mine && mine.steps ? mine.steps[k] : null;
    const rows = st.rows.map(function (r, n) {
      const grew = st.kt > 0 && r.alpha !== 1 && r.alpha !== 0;
      const y = yours ? yours.rows[n] : null;
      const differs = diff && diff.step === k && diff.row === r.i;
      const cells = [String(r.i), V.num(r.m, 4, { id: "fa-m-" + n }), V.num(r.alpha, 4, { id: "fa-alpha-" + n }),
        V.num(r.l, 4, { id: "fa-l-" + n }), V.num(r.acc, 3, { id: "fa-acc-" + n })];
      if (mine && mine.steps) cells.push(V.num(y ? y.acc : null, 3, { id: "fa-yours-acc-" + n }));
      return { attrs: { class: (grew ? "grew " : "") + (differs ? "differs" : ""), "data-row": r.i }, cells: cells };
    });
    const headers = ["row", "m", "α", "l", "acc"];
    if (mine && mine.steps) headers.push("your acc");
    V.clear(tableBox).appendChild(V.table(headers, rows, { id: "fa-state" }));
    // the formula for the row whose max grew most (or the first row)
    let n = 0;
    st.rows.forEach(function (r, i) { if (typeof r.alpha === "number" && r.alpha < st.rows[n].alpha) n = i; });
    const r = st.rows[n], p = prev ? prev.rows[n] : null;
    V.clear(formula);
    [
      ["row " + r.i + ", tile " + st.kt + (st.kt === 0 ? " (first: nothing to rescale)" : "")],
      ["m_new = max(m_old, rowmax S) = max(", V.num(r.m_old, 4), ", …) = ", V.num(r.m, 4)],
      ["α = exp(m_old − m_new) = ", V.num(r.alpha, 4)],
      ["l = α·", V.num(p ? p.l : 0, 4), " + Σ exp(s − m_new) = ", V.num(r.l, 4)],
      ["acc = α·", V.num(p ? p.acc : [0, 0], 3), " + P·V = ", V.num(r.acc, 3)],
    ].concat(lastK ? [["out = acc / l = ", V.num(r.out, 4), ",  lse = m + log l = ", V.num(r.lse, 4)]] : [])
      .forEach(function (line) { formula.appendChild(V.h("div", {}, line)); });
    // your first difference
    if (diff && diff.step === k && diff.row !== undefined) {
      rowMark.setAttribute("y", GY + diff.row * CELL - 1);
      rowMark.setAttribute("opacity", 1);
    } else rowMark.setAttribute("opacity", 0);
  }

  function renderStandard(k) {
    const ph = ref.standard[k];
    for (let i = 0; i < L; i++) for (let j = 0; j < L; j++) cells[i][j].setAttribute("fill", "#9467bd");
    qStrip.forEach(function (r) { r.setAttribute("fill", k === 0 ? "#f28e2b" : "#eee"); });
    kStrip.forEach(function (r) { r.setAttribute("fill", k !== 1 ? "#f28e2b" : "#eee"); });
    rowMark.setAttribute("opacity", 0);
    movers.q.attr("opacity", 0); movers.kv.attr("opacity", 0);
    tileBox.attr("opacity", 1).attr("x", GX - 1).attr("y", GY - 1).attr("width", L * CELL + 1).attr("height", L * CELL + 1);
    last = { qt: -1, mode: "standard" };
    meter(ref.steps[ref.steps.length - 1].hbm, ph.hbm_total, "whole run", "so far");
    sramText.textContent = "one kernel at a time: " + ph.name;
    sramText2.textContent = "its result goes back to HBM";
    hbmText.textContent = "Q, K, V, O and the full " + L + "×" + L + " " + (k === 0 ? "S" : "S and P");
    hbmText2.textContent = "S is " + V.bytes(ref.score_matrix_bytes) + " (lab 00's score_matrix_bytes)";
    caption.textContent = "Kernel " + (k + 1) + " of 3: " + ph.name + ", writing " + ph.writes + " to HBM.";
    V.clear(counters);
    dt("HBM traffic", V.bytes(ph.hbm_total), "fa-hbm");
    dt("FLOPs", V.count(ref.standard.slice(0, k + 1).reduce(function (a, s) { return a + s.flops; }, 0)), "fa-flops");
    dt("FlashAttention, whole run", V.bytes(ref.steps[ref.steps.length - 1].hbm), "fa-flash-total");
    document.getElementById("fa-hbm").setAttribute("data-value", String(ph.hbm_total));
    V.clear(formula).appendChild(V.h("div", {}, "softmax needs a whole row of S: the row max and sum come first, so S is written, read, and P written again."));
    V.clear(tableBox).appendChild(V.h("p", {}, "No running state: every row is normalised with its final max."));
  }

  player.go(0);
})();
