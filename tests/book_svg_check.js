/* Run in a page of the book by tests/test_book.py: every SVG text label of the visualisations
 * against what is drawn under it (after the panel's CSS filter: the dark scheme inverts
 * lightness), WCAG 2 contrast ratio; and every pair of labels whose boxes overlap. */
() => {
  // contrast of every SVG text against what is drawn under its centre, after the svg's CSS filter
  function parse(c) {
    const m = c && c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const v = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    return {r: v[0] / 255, g: v[1] / 255, b: v[2] / 255, a: v.length > 3 ? v[3] : 1};
  }
  function filt(c, f) {
    let {r, g, b} = c;
    const inv = f.match(/invert\(([\d.]+)\)/), hue = f.match(/hue-rotate\(([\d.]+)deg\)/);
    if (inv) { const a = Number(inv[1]); r = a * (1 - r) + (1 - a) * r; g = a * (1 - g) + (1 - a) * g; b = a * (1 - b) + (1 - a) * b; }
    if (hue) {
      const t = Number(hue[1]) * Math.PI / 180, cs = Math.cos(t), sn = Math.sin(t);
      const m = [0.213 + cs * 0.787 - sn * 0.213, 0.715 - cs * 0.715 - sn * 0.715, 0.072 - cs * 0.072 + sn * 0.928,
                 0.213 - cs * 0.213 + sn * 0.143, 0.715 + cs * 0.285 + sn * 0.140, 0.072 - cs * 0.072 - sn * 0.283,
                 0.213 - cs * 0.213 - sn * 0.787, 0.715 - cs * 0.715 + sn * 0.715, 0.072 + cs * 0.928 + sn * 0.072];
      const cl = (x) => Math.max(0, Math.min(1, x));
      [r, g, b] = [cl(m[0] * r + m[1] * g + m[2] * b), cl(m[3] * r + m[4] * g + m[5] * b), cl(m[6] * r + m[7] * g + m[8] * b)];
    }
    return {r, g, b, a: c.a};
  }
  function over(top, bot) { return {r: top.r * top.a + bot.r * (1 - top.a), g: top.g * top.a + bot.g * (1 - top.a), b: top.b * top.a + bot.b * (1 - top.a), a: 1}; }
  function lum(c) { const f = (x) => x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
  function ratio(a, b) { const la = lum(a), lb = lum(b); return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05); }
  const low = [], overlaps = [];
  document.querySelectorAll(".viz-svg").forEach(function (svg) {
    const f = getComputedStyle(svg).filter || "";
    const bg = parse(getComputedStyle(svg).backgroundColor);
    const texts = Array.from(svg.querySelectorAll("text")).filter((t) => t.textContent.trim() && t.getBBox().width > 0 && getComputedStyle(t).visibility !== "hidden" && getComputedStyle(t).display !== "none" && Number(getComputedStyle(t).opacity) > 0);
    const boxes = texts.map((t) => t.getBoundingClientRect());
    texts.forEach(function (t, i) {
      const b = boxes[i];
      const fg = parse(getComputedStyle(t).fill);
      if (!fg) return;
      // what is under the text's centre: the topmost filled shape that is not text, else the svg background
      const x = b.left + b.width / 2, y = b.top + b.height / 2;
      let under = bg;
      const stack = document.elementsFromPoint(x, y).filter((e) => svg.contains(e) && e !== svg && e.tagName !== "text" && e.tagName !== "tspan" && e.tagName !== "g");
      const layers = [];
      for (const e of stack) {
        const cs = getComputedStyle(e), fc = parse(cs.fill);
        if (!fc || fc.a === 0 || cs.fill === "none") continue;
        fc.a *= Number(cs.fillOpacity) * Number(cs.opacity);
        layers.push(fc);
        if (fc.a >= 1) break;
      }
      for (let k = layers.length - 1; k >= 0; k--) under = over(layers[k], under);
      const ts = getComputedStyle(t), halo = parse(ts.stroke);  // a label on its own halo
      if (halo && ts.stroke !== "none" && /^stroke/.test(ts.paintOrder) && parseFloat(ts.strokeWidth) >= 2) under = over(halo, under);
      const fgc = over({...fg, a: fg.a * Number(getComputedStyle(t).fillOpacity) * Number(getComputedStyle(t).opacity)}, under);
      const r = ratio(filt(fgc, f), filt(under, f));
      const big = parseFloat(getComputedStyle(t).fontSize) >= 18.66 || (parseFloat(getComputedStyle(t).fontSize) >= 14 && Number(getComputedStyle(t).fontWeight) >= 700);
      if (r < (big ? 3 : 4.5)) low.push({text: t.textContent.slice(0, 30), ratio: Math.round(r * 100) / 100, svg: svg.getAttribute("aria-label").slice(0, 30)});
    });
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], c = boxes[j], tol = 1;
      if (a.left + tol < c.right && c.left + tol < a.right && a.top + tol < c.bottom && c.top + tol < a.bottom)
        overlaps.push([texts[i].textContent.slice(0, 25), texts[j].textContent.slice(0, 25)]);
    }
  });
  return {low, overlaps};
}
