/* The run page: facts, live step row, the run log, the loss curve (inline SVG), predictions, artifacts. */
"use strict";
(function () {
  var root = document.getElementById("run");
  var logBox = document.getElementById("run-log");
  var svg = document.getElementById("loss-chart");
  var caption = document.getElementById("loss-caption");
  var cancelButton = document.getElementById("cancel-button");
  var after = 0;
  var points = [];       // [x, loss]
  var lastTotal = null, epochBase = 0, lastStep = -1;
  var predictionsShown = false;
  var finishedPolls = 0;
  var NS = "http://www.w3.org/2000/svg";

  cancelButton.addEventListener("click", function () {
    cancelButton.disabled = true;
    Potato.request("POST", root.dataset.cancel, undefined, root);
  });

  function line(text, cls) {
    var span = Potato.el("span", cls ? { "class": cls } : {}, text + "\n");
    var atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4;
    logBox.appendChild(span);
    if (atBottom) logBox.scrollTop = logBox.scrollHeight;
  }

  function describe(ev) {
    var d = ev.data || {};
    var t = Potato.time(ev.t).slice(11);
    switch (ev.kind) {
      case "log": return [t + " " + (d.level || "info").toUpperCase() + " " + d.message, d.level];
      // started and metrics are logged as run-log lines by the relay already.
      case "done": return [t + " worker done: " + d.status + (d.error ? " — " + d.error : ""), d.status === "succeeded" ? null : "error"];
      case "claimed": return [t + " claimed by the agent at " + (d.host || d.address), null];
      case "result": return [t + " agent reported exit code " + d.exit_code + (d.artifact_uri ? ", model at " + d.artifact_uri : ""), null];
      default: return null;
    }
  }

  function addProgress(d) {
    if (d.phase && d.phase !== "train") return;
    if (typeof d.loss !== "number" || typeof d.step !== "number") return;
    // Steps may restart per epoch in some trainers: keep x increasing.
    if (d.step <= lastStep && lastTotal) epochBase += lastStep;
    lastStep = d.step; lastTotal = d.total;
    points.push([epochBase + d.step, d.loss]);
  }

  function draw() {
    while (svg.lastChild && svg.lastChild.nodeName !== "desc") svg.removeChild(svg.lastChild);
    var desc = document.getElementById("loss-chart-desc");
    if (!points.length) return;
    var W = 640, H = 240, L = 44, R = 10, T = 10, B = 24;
    var xs = points.map(function (p) { return p[0]; }), ys = points.map(function (p) { return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    var pad = (y1 - y0) * 0.05 || Math.abs(y1) * 0.05 || 0.05;
    y0 -= pad; y1 += pad;
    if (x1 === x0) x1 = x0 + 1;
    function X(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function Y(y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); }
    function add(tag, attrs, text) {
      var e = document.createElementNS(NS, tag);
      Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
      if (text !== undefined) e.textContent = text;
      svg.appendChild(e); return e;
    }
    add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, "class": "axis" });
    add("line", { x1: L, y1: T, x2: L, y2: H - B, "class": "axis" });
    add("text", { x: 2, y: T + 8 }, y1.toFixed(3));
    add("text", { x: 2, y: H - B }, y0.toFixed(3));
    add("text", { x: L, y: H - 6 }, "step " + x0);
    add("text", { x: W - R - 60, y: H - 6 }, "step " + x1);
    add("polyline", { "class": "loss", points: points.map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ") });
    var last = points[points.length - 1];
    var text = points.length + " points; loss went from " + points[0][1].toFixed(4) + " to " + last[1].toFixed(4) + " by step " + last[0] + ".";
    desc.textContent = text;
    caption.textContent = text;
  }

  function facts(run) {
    var state = document.getElementById("run-state");
    var s = run.state + (run.cancel_requested && run.active ? " (cancelling)" : "");
    if (state.textContent !== s) { state.textContent = s; state.className = "state state-" + run.state; }
    document.getElementById("run-ran-on").textContent = run.ran_on.description;
    document.getElementById("run-started").textContent = Potato.time(run.started_at);
    document.getElementById("run-duration").textContent = Potato.duration(run.duration_s);
    document.getElementById("run-scores").textContent = Potato.scores(run.scores);
    document.getElementById("run-device").textContent = run.gpu || "–";
    if (run.artifact_uri) document.getElementById("run-artifact-uri").textContent = run.artifact_uri;
    var prefect = document.getElementById("run-prefect");
    if (run.prefect_url && !prefect.querySelector("a")) {
      prefect.textContent = "";
      prefect.appendChild(Potato.el("a", { href: run.prefect_url }, "this run in the Prefect UI"));
    }
    var step = document.getElementById("run-step");
    var open = run.state === "running" || run.state === "queued";
    var t = run.step || (run.state === "queued" ? "queued" + (run.queue_position ? " (#" + run.queue_position + " in the queue)" : "") : "");
    if (step.textContent !== t) step.textContent = t;
    var bar = document.getElementById("run-progress");
    bar.hidden = !open;
    if (typeof run.progress === "number") bar.value = run.progress; else bar.removeAttribute("value");
    cancelButton.hidden = !open;
    if (run.cancel_requested) cancelButton.disabled = true;
    var err = document.getElementById("run-error");
    err.hidden = !run.error || run.state === "succeeded";
    err.textContent = run.error || "";
  }

  function artifacts(list) {
    var ul = document.getElementById("artifacts");
    if (!list.length) return;
    ul.textContent = "";
    list.forEach(function (a) { ul.appendChild(Potato.el("li", {}, a.path + " (" + a.bytes + " bytes)")); });
  }

  function predictions() {
    return Potato.request("GET", root.dataset.predictions).then(function (data) {
      var box = document.getElementById("predictions");
      if (!data.available) { box.textContent = "This run wrote no predictions."; return; }
      box.textContent = "";
      box.appendChild(Potato.el("p", {}, data.count + " predictions."));
      Object.keys(data.schemas).forEach(function (name) {
        var s = data.schemas[name];
        var table = Potato.el("table");
        table.appendChild(Potato.el("caption", {}, name + (s.mean_confidence !== null ? " — mean confidence " + s.mean_confidence.toFixed(3) : "")));
        var head = Potato.el("tr"); head.appendChild(Potato.el("th", { scope: "col" }, "Label")); head.appendChild(Potato.el("th", { scope: "col" }, "Items"));
        table.appendChild(head);
        Object.keys(s.labels).forEach(function (label) {
          var tr = Potato.el("tr"); tr.appendChild(Potato.el("td", {}, label)); tr.appendChild(Potato.el("td", {}, String(s.labels[label])));
          table.appendChild(tr);
        });
        box.appendChild(table);
      });
    });
  }

  function refresh() {
    return Potato.request("GET", root.dataset.api + "?after=" + after).then(function (data) {
      if (data._status === 401) { window.location.reload(); return false; }
      if (!data.run) return;
      var grew = false;
      data.events.forEach(function (ev) {
        if (ev.kind === "progress") { addProgress(ev.data || {}); grew = true; return; }
        var d = describe(ev);
        if (d) line(d[0], d[1]);
      });
      after = data.next_after;
      if (grew) draw();
      facts(data.run);
      artifacts(data.artifacts);
      var ended = ["succeeded", "failed", "cancelled"].indexOf(data.run.state) >= 0;
      if (ended && !predictionsShown) { predictionsShown = true; predictions(); }
      if (data.more_events) return refresh();
      // After the end, poll a few more times for the last log lines, then stop.
      if (ended && ++finishedPolls > 3) return false;
    });
  }
  Potato.poll(refresh, 1000);
})();
