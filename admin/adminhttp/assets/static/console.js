// pgoutbox console: refreshes the page's live region (#live) without reloading,
// by fetching the same page's partial HTML, rendered and escaped by the server.
// No inline script anywhere: the Content-Security-Policy forbids it.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var stamp = document.getElementById("updated");
  var every = stamp ? parseInt(stamp.getAttribute("data-refresh"), 10) : 0;
  var tenant = document.getElementById("tenant");
  if (tenant && tenant.form) {
    tenant.addEventListener("change", function () { tenant.form.submit(); });
  }
  if (!live || !every || every < 1000) { return; }
  var url = live.getAttribute("data-live");
  var busy = false;
  function show(text) { if (stamp) { stamp.textContent = text; } }
  function tick() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        show("updated " + new Date().toLocaleTimeString());
        live.dispatchEvent(new CustomEvent("console:refreshed"));
      })
      .catch(function (e) { show("refresh failed (" + e.message + "); retrying"); })
      .then(function () { busy = false; });
  }
  show("live: refreshes every " + Math.round(every / 1000) + "s");
  setInterval(tick, every);
})();
