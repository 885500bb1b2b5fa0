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
  var banner = document.getElementById("stale");
  var busy = false;
  // fresh: when the figures shown were last read from the server (the page's
  // load, then each successful refresh). A refresh that fails, or gets no
  // answer within timeout, leaves them on the page greyed, under a banner
  // saying since when they are stale; the next success removes both.
  var fresh = new Date();
  var timeout = Math.max(2 * every, 10000);
  function show(text) { if (stamp) { stamp.textContent = text; } }
  function at(d) { return d.toLocaleTimeString() + " (" + d.toISOString().replace(/\.\d+Z$/, "Z") + ")"; }
  function stale(why) {
    live.classList.add("stale");
    live.setAttribute("aria-disabled", "true");
    if (banner) {
      banner.textContent = "Stale since " + at(fresh) + ", " + Math.round((Date.now() - fresh.getTime()) / 1000) +
        "s ago: refreshing the figures below fails (" + why + "); retrying every " + Math.round(every / 1000) + "s.";
      banner.hidden = false;
    }
    show("refresh failed (" + why + "); retrying");
  }
  function healed() {
    live.classList.remove("stale");
    live.removeAttribute("aria-disabled");
    if (banner) { banner.hidden = true; banner.textContent = ""; }
  }
  function tick() {
    if (busy || document.hidden) { return; }
    busy = true;
    var ctl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, timeout) : 0;
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" }, signal: ctl ? ctl.signal : undefined })
      .then(function (r) {
        if (!r.ok) { throw new Error("the console answered HTTP " + r.status); }
        return r.text();
      }, function () {
        throw new Error(ctl && ctl.signal.aborted ? "no answer within " + Math.round(timeout / 1000) + "s" : "the console did not answer");
      })
      .then(function (html) {
        live.innerHTML = html;
        fresh = new Date();
        healed();
        show("updated " + fresh.toLocaleTimeString());
        live.dispatchEvent(new CustomEvent("console:refreshed"));
      })
      .catch(function (e) { stale(e.message); })
      .then(function () { clearTimeout(timer); busy = false; });
  }
  show("live: refreshes every " + Math.round(every / 1000) + "s");
  setInterval(tick, every);
})();
