/* Your Triton kernels, traced: plays back book/kernel_traces.py's traces of lab 00's kernel
 * (traces/lab00-kernel-*.js) and lab 09's puzzles (traces/lab09-*.js), the reference's and,
 * when `make trace` made one, yours, with the first difference outlined at its program and
 * tile. Nothing is computed here: the numbers are the traces'. */
(function () {
  "use strict";
  const V = window.Viz;

  /* "your code" box: the command that makes a trace, or where the first difference is */
  function panel(parent, command, mine) {
    const box = V.h("div", { class: "viz-starter", "aria-live": "polite" });
    box.appendChild(V.h("h4", {}, "Your kernel"));
    if (mine === null || mine === undefined) {
      box.setAttribute("data-state", "none");
      box.appendChild(V.h("p", {}, ["No trace of your starter.py yet: run ", V.h("code", {}, command),
        " and reload this page."]));
    } else if (!mine.first_diff) {
      box.setAttribute("data-state", "match");
      box.appendChild(V.h("p", { class: "ok" }, "Your kernel loads, stores and computes what the reference does."));
    } else {
      const d = mine.first_diff;
      box.setAttribute("data-state", "differs");
      box.appendChild(V.h("p", { class: "bad" }, ["First difference: " + d.where + ", ", V.h("code", {}, d.field)]));
      box.appendChild(V.h("p", {}, ["yours ", V.h("code", { class: "num" }, V.fmtAny(d.yours)),
        " · reference ", V.h("code", { class: "num" }, V.fmtAny(d.reference))]));
      if ((mine.errors || []).length) {
        box.appendChild(V.h("p", { class: "err" }, ["Your code raised: ", V.h("code", {}, mine.errors[0])]));
      }
    }
    const main = V.h("div", { class: "viz-main" });  // one column on a phone, as every page
    const side = V.h("div", { class: "viz-side" });
    side.appendChild(box);
    main.appendChild(side);
    parent.appendChild(main);
    return mine && mine.first_diff ? mine.first_diff : null;
  }

  function cell(ref, yours, attrs) {
    const td = V.h("td", attrs || {});
    td.appendChild(V.h("div", {}, ref === undefined ? "—" : ref));
    if (yours !== ref) {
      td.appendChild(V.h("div", { class: "yours" }, "yours: " + (yours === undefined ? "—" : yours)));
    }
    return td;
  }

  function headRow(names) {
    const thead = V.h("thead");
    thead.appendChild(V.h("tr", {}, names.map(function (n) { return V.h("th", { scope: "col" }, n); })));
    return thead;
  }

  // ---- lab 00: programs x key tiles, and the running state of the chosen program ---------
  (function () {
    const root = document.getElementById("kt00-viz");
    const ref = V.trace("lab00-kernel-reference");
    if (!root || !ref) return;
    const mine = V.trace("lab00-kernel-starter");
    const diff = panel(root, "make trace LAB=00 KERNEL=1", mine);
    const mt = mine && mine.tiles ? mine.tiles : {};
    const pids = Object.keys(ref.tiles);
    const nt = Math.max.apply(null, pids.map(function (p) {
      return Math.max(ref.tiles[p].tiles.length, mt[p] ? mt[p].tiles.length : 0);
    }));
    const wide = V.h("div", { class: "viz-wide" });
    root.appendChild(wide);
    wide.appendChild(V.h("h4", {}, "Loads and stores, per program and key tile"));
    const table = V.h("table", { class: "viz-table kt-grid", id: "kt00-grid" });
    const names = ["program", "head, rows"];
    for (let t = 0; t < nt; t++) names.push("key tile " + (t + 1));
    names.push("stores");
    table.appendChild(headRow(names));
    const body = V.h("tbody");
    table.appendChild(body);
    wide.appendChild(table);
    const stateTitle = V.h("h4", {}, "");
    const stateBox = V.h("div", { id: "kt00-state" });
    wide.appendChild(stateTitle);
    wide.appendChild(stateBox);
    const rowsByPid = {};

    pids.forEach(function (pid) {
      const r = ref.tiles[pid], y = mt[pid];
      const tr = V.h("tr", { "data-program": pid, tabindex: "0" });
      tr.appendChild(V.h("th", { scope: "row" }, V.h("button", { type: "button", "data-program": pid }, pid)));
      tr.appendChild(V.h("td", {}, "head " + r.head + ", rows " + r.rows[0] + ".." + r.rows[r.rows.length - 1]));
      for (let t = 0; t < nt; t++) {
        const a = r.tiles[t] ? r.tiles[t].keys : undefined;
        const b = y ? (y.tiles[t] ? y.tiles[t].keys : undefined) : a;
        const td = cell(a, b, { "data-program": pid, "data-tile": String(t) });
        if (diff && diff.program === pid && diff.tile === t) td.classList.add("first-diff");
        tr.appendChild(td);
      }
      const st = function (s) { return s ? "out " + (s["stores of out"] || "none") + "; lse " + (s["stores of lse"] || "none") : undefined; };
      const sd = cell(st(r.stores), y ? st(y.stores) : st(r.stores), { "data-program": pid, "data-tile": "store" });
      if (diff && diff.program === pid && (diff.tile === null || diff.tile === undefined) &&
          String(diff.field).indexOf("store") === 0) sd.classList.add("first-diff");
      tr.appendChild(sd);
      tr.addEventListener("click", function () { choose(pid); });
      body.appendChild(tr);
      rowsByPid[pid] = tr;
    });

    function choose(pid) {
      Object.keys(rowsByPid).forEach(function (p) { rowsByPid[p].classList.toggle("chosen", p === pid); });
      root.setAttribute("data-program", pid);
      const r = ref.tiles[pid], y = mt[pid];
      stateTitle.textContent = "Running state of program " + pid + "'s rows after each key tile (m, l)";
      const n = Math.max(r.tiles.length, y ? y.tiles.length : 0);
      const heads = ["row"];
      for (let t = 0; t < n; t++) heads.push("tile " + (t + 1) + ": m, l");
      const ml = function (tile, i) {
        return tile && tile.m[i] !== undefined ? V.fmt(tile.m[i], 3) + ", " + V.fmt(tile.l[i], 3) : "—";
      };
      const rows = r.rows.map(function (row, i) {
        const cells = [String(row)];
        let differs = false;
        for (let t = 0; t < n; t++) {
          const a = ml(r.tiles[t], i);
          const b = y ? ml(y.tiles[t], i) : a;
          differs = differs || a !== b;
          cells.push(a === b ? a : a + " (yours " + b + ")");
        }
        return { cells: cells, attrs: differs ? { class: "differs" } : {} };
      });
      stateBox.textContent = "";
      stateBox.appendChild(V.table(heads, rows));
    }
    choose(diff && diff.program && ref.tiles[diff.program] ? diff.program : pids[0]);
    if (diff) {
      root.setAttribute("data-first-diff-program", String(diff.program));
      root.setAttribute("data-first-diff-tile", diff.tile === null || diff.tile === undefined ? "store" : String(diff.tile));
    }
  })();

  // ---- lab 09: per puzzle, each program's calls in order ----------------------------------
  (function () {
    const root = document.getElementById("kt09-viz");
    const ref = V.trace("lab09-reference");
    if (!root || !ref) return;
    const mine = V.trace("lab09-starter");
    const diff = panel(root, "make trace LAB=09", mine);
    const toolbar = V.h("div", { class: "viz-toolbar" });
    const select = V.h("select", { id: "kt09-puzzle", "aria-label": "puzzle" });
    ref.puzzles.forEach(function (p, i) {
      select.appendChild(V.h("option", { value: String(i) }, "puzzle " + p.puzzle + ": " + p.name));
    });
    toolbar.appendChild(V.h("label", { for: "kt09-puzzle" }, ["Puzzle ", select]));
    root.appendChild(toolbar);
    const wide = V.h("div", { class: "viz-wide" });
    root.appendChild(wide);

    function span(ix) {
      if (!ix || !ix.length) return "none";
      const run = ix[ix.length - 1] - ix[0] + 1 === ix.length;
      return run ? ix[0] + ".." + ix[ix.length - 1] + " (" + ix.length + ")" :
        ix.length + ": " + ix.slice(0, 6).join(", ") + (ix.length > 6 ? " …" : "");
    }
    /* the index in a program's calls of the n-th call of one access */
    function nth(calls, access, n) {
      let seen = -1;
      for (let i = 0; i < calls.length; i++) {
        if (calls[i][0] === access && ++seen === n) return i;
      }
      return -1;
    }

    function show(i) {
      select.value = String(i);
      root.setAttribute("data-puzzle", String(i));
      const r = ref.puzzles[i], y = mine && mine.puzzles ? mine.puzzles[i] : undefined;
      const rc = r.calls || {}, yc = y && y.calls ? y.calls : rc;
      const pids = Object.keys(rc).concat(Object.keys(yc).filter(function (p) { return !(p in rc); }));
      const n = Math.max.apply(null, [1].concat(pids.map(function (p) {
        return Math.max((rc[p] || []).length, (yc[p] || []).length);
      })));
      const names = ["program"];
      for (let c = 0; c < n; c++) names.push("call " + (c + 1));
      const table = V.h("table", { class: "viz-table kt-grid", id: "kt09-grid" });
      table.appendChild(headRow(names));
      const body = V.h("tbody");
      const here = diff && diff.step === i ? diff : null;
      pids.forEach(function (pid) {
        const tr = V.h("tr", { "data-program": pid });
        tr.appendChild(V.h("th", { scope: "row" }, pid));
        const a = rc[pid] || [], b = yc[pid] || [];
        let mark = -1;
        if (here && here.program === pid && here.call !== null && here.call !== undefined) {
          mark = nth(b, here.field, here.call);
          if (mark < 0) mark = nth(a, here.field, here.call);
        }
        for (let c = 0; c < n; c++) {
          const ta = a[c] ? a[c][0] + " " + span(a[c][1]) : undefined;
          const tb = b[c] ? b[c][0] + " " + span(b[c][1]) : undefined;
          const td = cell(ta, tb, { "data-program": pid, "data-call": String(c) });
          if (c === mark) td.classList.add("first-diff");
          tr.appendChild(td);
        }
        body.appendChild(tr);
      });
      table.appendChild(body);
      wide.textContent = "";
      wide.appendChild(table);
    }
    select.addEventListener("change", function () { show(Number(select.value)); });
    show(diff && typeof diff.step === "number" ? diff.step : 0);
    if (diff) {
      root.setAttribute("data-first-diff-program", String(diff.program));
      root.setAttribute("data-first-diff-call", String(diff.call));
    }
  })();
})();
