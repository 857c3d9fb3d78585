/* PagedAttention blocks: lab 07's KVCacheManager on a scripted stream (block tables, ref
 * counts, prefix hit, fork, copy-on-write), lab 07's simulate vs simulate_contiguous, and
 * lab 01's slot_mapping for one request. Plays back traces/lab07-*.js and lab01-*.js. */
(function () {
  "use strict";
  const V = window.Viz;
  const ref = V.trace("lab07-reference");
  const mine = V.trace("lab07-starter");
  const ref01 = V.trace("lab01-reference");
  const mine01 = V.trace("lab01-starter");
  const REQ_COLORS = { A: "#4e79a7", B: "#f28e2b", C: "#59a14f" };

  // ---- 1. block tables over one pool ----------------------------------------------------
  (function () {
    const root = document.getElementById("paged-viz");
    const player = new V.Player(root, { steps: ref.events.length, render: render, name: "paged" });
    root.appendChild(player.bar);
    const { svg, side } = V.panes(root, "0 0 420 330",
      "block tables of requests A, B, C pointing into a pool of blocks");
    V.arrowDefs(svg, "pa-arrow", "#555");
    V.arrowDefs(svg, "pa-arrow-cow", "#d62728");
    const caption = V.h("p", { class: "viz-caption", id: "paged-caption" });
    side.appendChild(caption);
    const counters = V.h("dl", { class: "viz-counters", id: "paged-counters" });
    side.appendChild(counters);
    const diff = V.starterPanel(side, "07", mine, function (k) { player.go(k); });
    const layer = V.s("g", {}, svg);
    V.legend(svg, 10, 290, [
      { color: "#fff", stroke: "#555", label: "block table entry → block" },
      { color: "#fde2e2", stroke: "#d62728", label: "copy-on-write" },
      { color: "#e8e8e8", label: "free block" },
      { color: "#ffe9a8", label: "shared (ref count > 1)" },
    ], 400);

    function render(k) {
      const ev = ref.events[k];
      V.clear(layer);
      V.s("text", { x: 10, y: 16, class: "title" }, layer, "Block tables");
      V.s("text", { x: 250, y: 16, class: "title" }, layer, "Block pool (" + ref.pool.num_blocks + " × " + ref.pool.block_size + " slots)");
      const pool = {};
      for (let b = 0; b < ref.pool.num_blocks; b++) {
        const x = 250 + (b % 2) * 80, y = 30 + Math.floor(b / 2) * 50;
        const rc = ev.ref_counts[b];
        pool[b] = { x: x, y: y };
        V.s("rect", { x: x, y: y, width: 70, height: 36, rx: 4, id: "paged-block-" + b,
          fill: rc === 0 ? "#e8e8e8" : rc > 1 ? "#ffe9a8" : "#fff", stroke: "#777" }, layer);
        V.s("text", { x: x + 5, y: y + 15 }, layer, "block " + b);
        V.s("text", { x: x + 5, y: y + 30 }, layer, "ref " + rc);
      }
      Object.keys(ev.tables).forEach(function (rid, r) {
        const y = 40 + r * 80;
        V.s("text", { x: 10, y: y + 16, fill: REQ_COLORS[rid] || "#333", class: "title" }, layer, rid);
        ev.tables[rid].forEach(function (b, j) {
          const x = 30 + j * 44;
          V.s("rect", { x: x, y: y, width: 38, height: 24, rx: 3, fill: "#fff", stroke: REQ_COLORS[rid] || "#333",
            "stroke-width": 2 }, layer);
          V.s("text", { x: x + 12, y: y + 16 }, layer, String(b));
          const to = pool[b];
          V.s("path", { d: "M" + (x + 19) + "," + (y + 24) + " C" + (x + 19) + "," + (y + 60) + " " + (to.x - 40) + "," +
            (to.y + 18) + " " + to.x + "," + (to.y + 18), fill: "none", stroke: REQ_COLORS[rid] || "#555",
            "stroke-width": 1.2, opacity: 0.75, "marker-end": "url(#pa-arrow)" }, layer);
        });
      });
      (ev.copies || []).forEach(function (c) {
        const a = pool[c[0]], b = pool[c[1]];
        V.s("path", { d: "M" + (a.x + 70) + "," + (a.y + 18) + " C" + (a.x + 100) + "," + (a.y + 18) + " " + (b.x + 100) +
          "," + (b.y + 18) + " " + (b.x + 70) + "," + (b.y + 18), fill: "none", stroke: "#d62728", "stroke-width": 2.5,
          "stroke-dasharray": "4 3", "marker-end": "url(#pa-arrow-cow)", id: "paged-cow" }, layer);
      });
      caption.textContent = ev.event;
      V.clear(counters);
      const shared = ev.ref_counts.filter(function (r) { return r > 1; }).length;
      [["free blocks", V.num(ev.free_blocks, 0, { id: "paged-free" })],
        ["shared blocks", V.num(shared, 0, { id: "paged-shared" })],
        ["copies this step", V.num((ev.copies || []).length, 0, { id: "paged-copies" })],
        ["prefix-cache hit", ev.cached_tokens !== undefined ? ev.cached_tokens + " tokens" : "—"]]
        .forEach(function (p) { counters.appendChild(V.h("dt", {}, p[0])); counters.appendChild(V.h("dd", {}, p[1])); });
      if (diff && diff.step === k) caption.textContent += "  ← your code differs here: " + diff.field;
    }
    player.go(0);
  })();

  // ---- 2. contiguous reservations vs a block pool for one request stream ----------------
  (function () {
    const root = document.getElementById("stream-viz");
    const runs = [["contiguous", ref.contiguous, "Contiguous: max_model_len reserved per request"],
      ["paged", ref.paged, "Block pool: blocks on demand, shared prefix"]];
    const n = Math.max(ref.paged.steps, ref.contiguous.steps);
    const player = new V.Player(root, { steps: n, render: render, name: "stream" });
    root.appendChild(player.bar);
    const { svg, side } = V.panes(root, "0 0 420 300",
      "used and reserved KV slots per scheduler step, contiguous vs paged");
    const layer = V.s("g", {}, svg);
    V.legend(svg, 10, 270, [{ color: "#4e79a7", label: "used slots (real tokens)" },
      { color: "#c9d3df", label: "reserved but empty" }, { color: "#fff", stroke: "#d62728", label: "this step" },
      { color: "#59a14f", label: "the new request, admitted" }], 400);
    // "a new request arrives now": what each pool has free at this step (total − reserved,
    // from lab 07's Stats) against what the request needs (contiguous: max_model_len slots;
    // paged: its prompt's blocks), side by side
    const arrive = V.h("button", { type: "button", id: "stream-arrive", "aria-pressed": "false",
      "data-action": "arrive" }, "A new request arrives now");
    let arriving = false;
    arrive.addEventListener("click", function () {
      arriving = !arriving;
      arrive.setAttribute("aria-pressed", String(arriving));
      arrive.textContent = arriving ? "Take the new request back" : "A new request arrives now";
      render(player.step);
    });
    player.bar.appendChild(arrive);
    const newPrompt = ref.workload[0][1];  // the stream's first prompt length, arriving again
    function need(run) {
      const bs = ref.stream.block_size;
      return run === "contiguous" ? ref.stream.max_model_len : Math.ceil(newPrompt / bs) * bs;
    }

    function render(k) {
      V.clear(layer);
      const total = ref.paged.total_slots;
      runs.forEach(function (run, r) {
        const st = run[1], y0 = 20 + r * 125, h = 90, bw = 380 / n;
        V.s("text", { x: 10, y: y0, class: "title" }, layer, run[2]);
        for (let t = 0; t < st.steps; t++) {
          const hr = h * st.reserved[t] / total, hu = h * st.used[t] / total;
          V.s("rect", { x: 20 + t * bw, y: y0 + 10 + h - hr, width: bw - 2, height: hr, fill: "#c9d3df" }, layer);
          V.s("rect", { x: 20 + t * bw, y: y0 + 10 + h - hu, width: bw - 2, height: hu, fill: "#4e79a7" }, layer);
        }
        V.s("rect", { x: 19 + k * bw, y: y0 + 8, width: bw, height: h + 4, fill: "none", stroke: "#d62728", "stroke-width": 2 }, layer);
        V.s("line", { x1: 20, x2: 400, y1: y0 + 10, y2: y0 + 10, stroke: "#999", "stroke-dasharray": "3 3" }, layer);
        V.s("text", { x: 340, y: y0 + 8 }, layer, total + " slots");
        if (arriving && k < st.steps) {
          const free = total - st.reserved[k], fits = free >= need(run[0]);
          const hr = h * st.reserved[k] / total, hn = h * need(run[0]) / total;
          if (fits) {
            V.s("rect", { x: 20 + k * bw, y: y0 + 10 + h - hr - hn, width: bw - 2, height: hn, fill: "#59a14f",
              id: "stream-new-" + run[0] }, layer);
          }
          V.s("text", { x: Math.max(30, 20 + k * bw + bw / 2), y: y0 + h + 24, "text-anchor": "middle", class: "title",
            fill: fits ? "#1d7a1d" : "#d62728", id: "stream-verdict-" + run[0] }, layer, fits ? "fits" : "OOM");
        }
      });
      V.clear(side);
      const rows = runs.map(function (run) {
        const st = run[1], done = k >= st.steps;
        const t = Math.min(k, st.steps - 1);
        return { cells: [run[0], done ? "finished" : V.num(st.running[t], 0, { id: "stream-running-" + run[0] }),
          done ? "—" : V.num(st.used[t], 0, { id: "stream-used-" + run[0] }),
          done ? "—" : V.num(st.reserved[t] - st.used[t], 0, { id: "stream-waste-" + run[0] })] };
      });
      side.appendChild(V.h("h4", {}, "At step " + (k + 1)));
      side.appendChild(V.table(["", "running", "used", "reserved, empty"], rows));
      if (arriving) {
        side.appendChild(V.h("h4", {}, "A new request (" + newPrompt + "-token prompt) arrives at step " + (k + 1)));
        side.appendChild(V.table(["", "free slots", "it needs", ""], runs.map(function (run) {
          const st = run[1];
          if (k >= st.steps) return { cells: [run[0], "—", "—", "the stream is done"] };
          const free = total - st.reserved[k], fits = free >= need(run[0]);
          return { attrs: { "data-fits": String(fits), id: "stream-arrival-" + run[0] }, cells: [run[0],
            V.num(free, 0, { id: "stream-free-" + run[0] }), V.num(need(run[0]), 0, { id: "stream-need-" + run[0] }),
            fits ? "admitted" : "out of memory: it waits"] };
        }), { id: "stream-arrival" }));
        side.appendChild(V.h("p", { class: "viz-note" }, "Contiguous reserves max_model_len (" + ref.stream.max_model_len +
          " slots) for every request, however short; paged needs only the blocks of its prompt (" + ref.stream.block_size +
          " slots a block) and takes them anywhere in the pool."));
      }
      side.appendChild(V.h("h4", {}, "Whole run (lab 07's simulate)"));
      // "held slots filled" is what paging improves; the pool's mean use can be lower for
      // paged because it stores the shared prefix once and finishes the same work sooner
      const scroll = V.h("div", { class: "viz-wide" }); // six columns: scrolls sideways on a phone
      side.appendChild(scroll);
      scroll.appendChild(V.table(["", "steps", "held slots filled", "pool use (mean)", "preempted", "cached prompt"],
        runs.map(function (run) {
          const st = run[1];
          return { cells: [run[0], V.num(st.steps, 0, { id: "stream-steps-" + run[0] }),
            pct(1 - st.waste, "stream-filled-" + run[0]), pct(st.mean_utilisation, "stream-pool-" + run[0]),
            String(st.preemptions), st.cached_prompt_tokens + " / " + st.prompt_tokens] };
        })));
      const c = ref.contiguous, pg = ref.paged;
      side.appendChild(V.h("p", { class: "viz-note", id: "stream-why" }, [
        "Paged fills ", pct(1 - pg.waste), " of the slots it holds, contiguous ", pct(1 - c.waste),
        ". Its mean pool use is lower (", pct(pg.mean_utilisation), " vs ", pct(c.mean_utilisation),
        ") because it needs less memory for the same work: the shared prompt is stored once (",
        String(pg.cached_prompt_tokens), " of ", String(pg.prompt_tokens), " prompt tokens were cache hits), up to ",
        String(Math.max.apply(null, pg.running)), " requests run at once instead of ", String(Math.max.apply(null, c.running)),
        ", and all ", String(ref.workload.length), " finish in ", String(pg.steps), " steps instead of ", String(c.steps), "."]));
    }
    function pct(x, id) {
      return V.h("span", { class: "num", id: id, "data-value": JSON.stringify(x) }, (100 * x).toFixed(1) + "%");
    }
    player.go(0);
  })();

  // ---- 3. one request's block table: slot_mapping (lab 01) ------------------------------
  (function () {
    const root = document.getElementById("slots-viz");
    const inp = ref01.inputs, bs = inp.block_size;
    const player = new V.Player(root, { steps: ref01.steps.length, render: render, name: "slots" });
    root.appendChild(player.bar);
    const { svg, side } = V.panes(root, "0 0 420 250",
      "token positions, block table, physical slots");
    V.arrowDefs(svg, "sl-arrow", "#d62728");
    const caption = V.h("p", { class: "viz-caption", id: "slots-caption" });
    side.appendChild(caption);
    const diff = V.starterPanel(side, "01", mine01, function (k) { player.go(k); });
    const layer = V.s("g", {}, svg);
    V.legend(svg, 10, 228, [{ color: "#f28e2b", label: "this token" }, { color: "#4e79a7", label: "written" },
      { color: "#e8e8e8", label: "unused slot" }], 400);

    function render(k) {
      V.clear(layer);
      const st = ref01.steps[k];
      V.s("text", { x: 10, y: 14, class: "title" }, layer, "Logical: token positions, " + bs + " per block");
      for (let t = 0; t < ref01.steps.length; t++) {
        V.s("rect", { x: 10 + t * 26 + Math.floor(t / bs) * 8, y: 22, width: 22, height: 22, rx: 3,
          fill: t === k ? "#f28e2b" : t < k ? "#4e79a7" : "#fff", stroke: "#777" }, layer);
        V.s("text", { x: 14 + t * 26 + Math.floor(t / bs) * 8, y: 37, fill: t < k ? "#fff" : "#222" }, layer, String(t));
      }
      V.s("text", { x: 10, y: 70, class: "title" }, layer, "block_table = [" + inp.block_table.join(", ") + "]");
      V.s("text", { x: 10, y: 104, class: "title" }, layer, "Physical cache: " + inp.num_blocks + " blocks × " + bs + " slots");
      const written = {};
      for (let t = 0; t <= k; t++) written[ref01.steps[t].slot] = t;
      for (let b = 0; b < inp.num_blocks; b++) {
        for (let o = 0; o < bs; o++) {
          const slot = b * bs + o, x = 10 + b * 50 + o * 11, y = 150;
          const t = written[slot];
          V.s("rect", { x: x, y: y, width: 10, height: 26, fill: t === k ? "#f28e2b" : t !== undefined ? "#4e79a7" : "#e8e8e8",
            stroke: "#999", "stroke-width": 0.5, id: "slot-" + slot }, layer);
        }
        V.s("text", { x: 12 + b * 50, y: 194 }, layer, "blk " + b);
      }
      const tx = 21 + k * 26 + Math.floor(k / bs) * 8, sx = 15 + st.block * 50 + st.offset * 11;
      V.s("path", { d: "M" + tx + ",46 C" + tx + ",110 " + sx + ",100 " + sx + ",148", fill: "none", stroke: "#d62728",
        "stroke-width": 2, "marker-end": "url(#sl-arrow)" }, layer);
      caption.textContent = "token " + st.token + ": logical block " + st.logical_block + ", offset " + st.offset +
        " → block_table[" + st.logical_block + "] = " + inp.block_table[st.logical_block] + " → slot " +
        inp.block_table[st.logical_block] + "·" + bs + " + " + st.offset + " = " + st.slot;
      caption.setAttribute("data-slot", String(st.slot));
      if (diff && diff.step === k) caption.textContent += "  ← yours: " + V.fmt(diff.yours, 0);
    }
    player.go(0);
  })();
})();
