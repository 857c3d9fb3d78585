/* The glossary by tap: every glossary term (an <abbr title> from GLOSSARY.md, book/build.py)
 * becomes focusable, and a tap or click focuses it, so Material's tooltip (which follows
 * hover and focus) opens on a touch screen, where there is no hover, and keyboard users
 * reach every term with Tab. Escape moves the focus away. */
(function () {
  "use strict";
  function arm() {
    document.querySelectorAll("article abbr[title]").forEach(function (el) {
      if (el.hasAttribute("tabindex")) return;
      el.setAttribute("tabindex", "0");
      el.setAttribute("data-glossary", "tap");
      el.addEventListener("click", function () { el.focus(); });
      el.addEventListener("keydown", function (e) { if (e.key === "Escape") el.blur(); });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", arm);
  else arm();
})();
