/* The book's maths: Python Markdown's arithmatex (generic mode) leaves every formula as
 * <span class="arithmatex">\(…\)</span> (inline) or <div class="arithmatex">\[…\]</div>
 * (display); this typesets them with the vendored KaTeX (vendor/katex/, offline). KaTeX's
 * script and styles are added only to pages that hold a formula, so a page without maths
 * does not load them. Visualisations that draw a formula call BookMath.typeset(el) after
 * each render (a no-op until KaTeX has loaded; its load typesets the whole page).
 * On a visualisation's page KaTeX writes MathML only, which the browser typesets with its
 * own fonts: no KaTeX stylesheet or fonts (about 50 KB), so the page stays under its
 * 200 KB budget; a lesson page gets KaTeX's own fonts (HTML and MathML). */
(function () {
  "use strict";
  const me = document.currentScript ? document.currentScript.src : "";
  const base = me.replace(/[^/]*$/, "") + "vendor/katex/";
  let loading = false;
  const mathmlOnly = function () { return !!document.querySelector(".viz"); };
  function strip(tex) {
    const t = tex.trim();
    if ((t.startsWith("\\(") && t.endsWith("\\)")) || (t.startsWith("\\[") && t.endsWith("\\]"))) {
      return t.slice(2, -2);
    }
    return t;
  }
  function typeset(root) {
    if (!window.katex) return;
    (root || document).querySelectorAll(".arithmatex:not([data-typeset])").forEach(function (el) {
      const display = el.tagName === "DIV" || /^\s*\\\[/.test(el.textContent);
      const tex = strip(el.textContent);
      el.setAttribute("data-tex", tex);
      window.katex.render(tex, el, { displayMode: display, throwOnError: false, output: mathmlOnly() ? "mathml" : "htmlAndMathml" });
      el.setAttribute("data-typeset", "katex");
    });
  }
  function load() {
    if (loading || window.katex || !document.querySelector(".arithmatex")) return;
    loading = true;
    if (!mathmlOnly()) {
      const css = document.createElement("link");
      css.rel = "stylesheet";
      css.href = base + "katex.min.css";
      document.head.appendChild(css);
    }
    const js = document.createElement("script");
    js.src = base + "katex.min.js";
    js.onload = function () { typeset(document); };
    document.head.appendChild(js);
  }
  window.BookMath = { typeset: function (root) { if (window.katex) typeset(root); else load(); } };
  load();
})();
