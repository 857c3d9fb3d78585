/* Run in a page of the book by tests/test_book.py: SVG text that its box cuts off. A label
 * must lie inside its drawing (the svg's own box: outside it, it is clipped away), and a
 * label written on a box (the rectangle under its centre, drawn before it) must fit inside
 * that box: text running over a bar's or a panel's edge reads as clipped. */
() => {
  const outside = [], overflow = [];
  document.querySelectorAll(".viz-svg").forEach(function (svg) {
    const frame = svg.getBoundingClientRect();
    if (frame.width === 0) return;
    const name = (svg.getAttribute("aria-label") || svg.id || "svg").slice(0, 30);
    svg.querySelectorAll("text").forEach(function (t) {
      const cs = getComputedStyle(t);
      if (!t.textContent.trim() || cs.display === "none" || cs.visibility === "hidden" || Number(cs.opacity) === 0) return;
      const b = t.getBoundingClientRect();
      if (b.width === 0) return;
      const tol = 1;
      if (b.left < frame.left - tol || b.right > frame.right + tol || b.top < frame.top - tol || b.bottom > frame.bottom + tol) {
        outside.push({ text: t.textContent.slice(0, 30), svg: name });
        return;
      }
      const under = document.elementsFromPoint(b.left + b.width / 2, b.top + b.height / 2)
        .find((e) => svg.contains(e) && e.tagName === "rect");
      if (!under) return;
      const us = getComputedStyle(under);
      if (us.fill === "none" || Number(us.opacity) === 0 || Number(us.fillOpacity) === 0) return;
      if (under.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_PRECEDING) return;  // drawn over the text
      const r = under.getBoundingClientRect();
      if (r.height < b.height * 0.9) return;  // a thin bar or line under the text, not its box
      if (b.left < r.left - tol || b.right > r.right + tol) {
        overflow.push({ text: t.textContent.slice(0, 30), svg: name, over: Math.round(Math.max(r.left - b.left, b.right - r.right)) });
      }
    });
  });
  return { outside, overflow };
}
