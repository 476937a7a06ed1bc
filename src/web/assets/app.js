// taskq web: refreshes the overview in place every second while the tab is
// visible, and stops while it is hidden. No other script runs on the pages.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) {
    return;
  }
  var every = 1000;
  var timer = null;
  var busy = false;

  function schedule() {
    if (timer === null && !document.hidden) {
      timer = window.setTimeout(tick, every);
    }
  }

  function tick() {
    timer = null;
    if (document.hidden || busy) {
      return;
    }
    busy = true;
    fetch(live.getAttribute("data-src"), {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Accept": "text/html" }
    })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        // Markup drawn and escaped by the server; scripts in it never run.
        live.innerHTML = html;
        live.setAttribute("data-updated", String(Date.now()));
        live.classList.remove("stale");
      })
      .catch(function () {
        live.classList.add("stale");
      })
      .then(function () {
        busy = false;
        schedule();
      });
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      if (timer !== null) {
        window.clearTimeout(timer);
        timer = null;
      }
    } else {
      tick();
    }
  });
  schedule();
})();
