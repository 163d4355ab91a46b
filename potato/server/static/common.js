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
  function time(t) {
    if (!t) return "–";
    var d = new Date(t * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return s + " s";
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) return m + " min " + pad(s) + " s";
    return Math.floor(m / 60) + " h " + pad(m % 60) + " min";
  }
  function scores(sc) {
    var names = Object.keys(sc || {}).sort();
    if (!names.length) return "–";
    return names.map(function (n) {
      var s = sc[n] || {};
      if (typeof s.ece_before === "number") {  // decision-calibrate's scores
        return n + ": ECE " + s.ece_before.toFixed(3) + (typeof s.ece_after === "number" ? " → " + s.ece_after.toFixed(3) : "") +
          (s.kept ? " (kept)" : " (backed out)");
      }
      var acc = typeof s.accuracy === "number" ? s.accuracy.toFixed(3) : "?";
      var f1 = typeof s.macro_f1 === "number" ? s.macro_f1.toFixed(3) : "?";
      return n + ": accuracy " + acc + ", macro-F1 " + f1 + (s.n !== undefined ? " (n=" + s.n + ")" : "");
    }).join("; ");
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
  return { request: request, time: time, duration: duration, scores: scores, el: el, poll: poll };
})();
