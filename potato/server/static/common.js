/* Shared by the Training page and the run page: fetch JSON, format times. No dependencies. */
"use strict";
var Potato = (function () {
  function headers(el, json) {
    var h = { "Accept": "application/json" };
    if (json) h["Content-Type"] = "application/json";
    if (el && el.dataset.csrfHeader) h[el.dataset.csrfHeader] = el.dataset.csrfValue;
    return h;
  }
  function request(method, url, body, el) {
    var opts = { method: method, headers: headers(el, body !== undefined), credentials: "same-origin" };
    if (body !== undefined) opts.body = JSON.stringify(body);
    return fetch(url, opts).then(function (r) {
      return r.json().catch(function () { return { error: "The server answered " + r.status }; })
        .then(function (data) { data._status = r.status; return data; });
    });
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  // "2025-03-01 14:02:11 UTC+01:00": the browser's local time with its offset from UTC, as the CLI prints it.
  function time(t) {
    if (!t) return "–";
    var d = new Date(t * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(t) + " " + offset(d);
  }
  function clock(t) {
    var d = new Date(t * 1000);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function offset(d) {
    var minutes = -d.getTimezoneOffset();
    if (!minutes) return "UTC";
    var a = Math.abs(minutes);
    return "UTC" + (minutes > 0 ? "+" : "-") + pad(Math.floor(a / 60)) + ":" + pad(a % 60);
  }
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return s + " s";
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) return m + " min " + pad(s) + " s";
    return Math.floor(m / 60) + " h " + pad(m % 60) + " min";
  }
  // The server words each schema's scores (potato/text/score_text.py: each kind its own metrics).
  function scores(lines) {
    return lines && lines.length ? lines.join("; ") : "–";
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  // Poll fn every ms; back off to 5 s while the server does not answer.
  function poll(fn, ms) {
    var delay = ms;
    function tick() {
      Promise.resolve().then(fn).then(function (again) {
        delay = ms;
        if (again !== false) setTimeout(tick, delay);
      }, function () { delay = Math.min(delay * 2, 5000); setTimeout(tick, delay); });
    }
    tick();
  }
  // Cancel asks first, as retract does: a cancelled run keeps no model and no predictions.
  function confirmCancel(id, grace) {
    return window.confirm("Cancel run " + id + "? A queued run ends at once; a running one's worker gets SIGTERM, " +
      "then SIGKILL after " + grace + " s. A cancelled run keeps no model and writes no predictions back.");
  }
  return { confirmCancel: confirmCancel, request: request, time: time, clock: clock, duration: duration, scores: scores, el: el, poll: poll };
})();
