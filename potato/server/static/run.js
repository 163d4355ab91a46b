/* The run page: facts, live step row, the run log, the loss curve (epochs marked, validation loss per epoch
   where the run reports it), per schema its holdout picture (a label schema's accuracy beside the trivial
   baseline, confusion matrix, reliability diagram before and after calibration, and precision, recall and F1
   per label; a multilabel schema's confusion per label, a span schema's matches per label; all inline SVG or
   tables, no outside assets), predictions, artifacts. */
"use strict";
(function () {
  var root = document.getElementById("run");
  var logBox = document.getElementById("run-log");
  var svg = document.getElementById("loss-chart");
  var caption = document.getElementById("loss-caption");
  var cancelButton = document.getElementById("cancel-button");
  var after = 0;
  var points = [];       // [x, training loss]
  var validation = [];   // [x, validation loss], one per epoch where the run holds a validation share out
  var epochs = [];       // [x, epoch]: where each epoch ended
  var lastTotal = null, epochBase = 0, lastStep = -1, lastEpoch = 0;
  var predictionsShown = false;
  var ended = false, runState = "";
  var finishedPolls = 0;
  var NS = "http://www.w3.org/2000/svg";

  cancelButton.addEventListener("click", function () {
    if (!Potato.confirmCancel(root.dataset.runId, root.dataset.grace)) return;
    cancelButton.disabled = true;
    Potato.request("POST", root.dataset.cancel, undefined, root);
  });

  // Retract: annotators stop seeing the run's predictions; the newest earlier run's come back.
  var retractBox = document.getElementById("retract");
  var retractButton = document.getElementById("retract-button");
  var retractStatus = document.getElementById("retract-status");
  retractButton.addEventListener("click", function () {
    if (!window.confirm(retractButton.dataset.confirm)) return;
    retractButton.disabled = true;
    retractStatus.className = "";
    retractStatus.textContent = "Retracting…";
    Potato.request("DELETE", retractBox.dataset.api, undefined, retractBox).then(function (data) {
      retractStatus.className = data._status === 200 ? "" : "error";
      retractStatus.textContent = data._status === 200 ? data.message : (data.error || "The server answered " + data._status);
      if (data.run) retractState(data.run);
    }, function () { retractStatus.className = "error"; retractStatus.textContent = "The server did not answer"; })
      .then(function () { retractButton.disabled = false; });
  });
  function retractState(run) {
    retractButton.hidden = !run.retractable;
    retractButton.dataset.confirm = "Retract run " + run.id + "'s predictions? Annotators stop seeing them, and " +
      "the newest earlier run's predictions come back.";
    if (run.retracted_at && !retractStatus.textContent)
      retractStatus.textContent = "Retracted " + Potato.time(run.retracted_at) + ": annotators no longer see these predictions.";
  }

  // The quality gate's verdict per schema; a run it held back can be promoted (written back anyway).
  var gateBox = document.getElementById("gate");
  var promoteButton = document.getElementById("promote-button");
  var promoteStatus = document.getElementById("promote-status");
  promoteButton.addEventListener("click", function () {
    if (!window.confirm(promoteButton.dataset.confirm)) return;
    promoteButton.disabled = true;
    promoteStatus.className = "";
    promoteStatus.textContent = "Writing back…";
    Potato.request("POST", gateBox.dataset.api, undefined, gateBox).then(function (data) {
      promoteStatus.className = data._status === 200 ? "" : "error";
      promoteStatus.textContent = data._status === 200 ? "Promoted: annotators see these predictions now. " + data.writeback
        : (data.error || "The server answered " + data._status);
      if (data.run) gateState(data.run);
    }, function () { promoteStatus.className = "error"; promoteStatus.textContent = "The server did not answer"; })
      .then(function () { promoteButton.disabled = false; });
  });
  function gateState(run) {
    var list = document.getElementById("gate-lines");
    var lines = (run.gate_text || []).slice();
    if (run.predictions_state === "live" || run.predictions_state === "live, pinned")
      lines.unshift("Annotators see this run's predictions now" + (run.pinned ? " (pinned)." : "."));
    var key = lines.join("\n");
    if (list.dataset.key !== key) {
      list.dataset.key = key;
      list.textContent = "";
      lines.forEach(function (text) { list.appendChild(Potato.el("li", {}, text)); });
    }
    promoteButton.hidden = !run.promotable;
    promoteButton.dataset.confirm = "Write run " + run.id + "'s predictions back although the quality gate held " +
      "them back? Annotators then see them in place of the ones they see now.";
  }

  function how(state) { return state === "cancelled" ? "was cancelled" : state; }

  function line(text, cls) {
    var span = Potato.el("span", cls ? { "class": cls } : {}, text + "\n");
    var atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4;
    logBox.appendChild(span);
    if (atBottom) logBox.scrollTop = logBox.scrollHeight;
  }

  function describe(ev) {
    var d = ev.data || {};
    var t = Potato.clock(ev.t);  // the offset is in Started above
    switch (ev.kind) {
      case "log": return [t + " " + (d.level || "info").toUpperCase() + " " + d.message, d.level];
      // started and metrics are logged as run-log lines by the relay already.
      case "done": return [t + " worker done: " + d.status + (d.error ? " — " + d.error : ""), d.status === "succeeded" ? null : "error"];
      case "claimed": return [t + " claimed by the agent at " + (d.host || d.address), null];
      case "result": return [t + " agent reported exit code " + d.exit_code + (d.artifact_uri ? ", model at " + d.artifact_uri : ""), null];
      case "cancel": return [t + " WARNING Cancel requested " + d.by, "warning"];
      case "validation": return typeof d.loss === "number" ?
        [t + " INFO validation loss " + d.loss.toFixed(4) + (d.epoch !== undefined ? " after epoch " + d.epoch : ""), null] : null;
      default: return null;
    }
  }

  function addProgress(d) {
    if (d.phase && d.phase !== "train") return;
    if (typeof d.step !== "number") return;
    // Steps start again for each schema (one model each): keep x increasing.
    if (d.step < lastStep && lastTotal) { epochBase += lastStep; lastEpoch = 0; }
    lastStep = d.step; lastTotal = d.total;
    var x = epochBase + d.step;
    // An epoch ends where the fractional epoch reaches the next whole number.
    if (typeof d.epoch === "number" && Math.floor(d.epoch) > lastEpoch) {
      lastEpoch = Math.floor(d.epoch);
      epochs.push([x, lastEpoch]);
    }
    if (typeof d.loss === "number") points.push([x, d.loss]);
    if (typeof d.validation_loss === "number") validation.push([x, d.validation_loss]);
  }
  function addValidation(d) {  // a "validation" event: the held-out validation share's loss after an epoch
    if (typeof d.loss !== "number") return false;
    validation.push([epochBase + (typeof d.step === "number" ? d.step : Math.max(lastStep, 0)), d.loss]);
    return true;
  }

  function draw() {
    while (svg.lastChild && svg.lastChild.nodeName !== "desc") svg.removeChild(svg.lastChild);
    var desc = document.getElementById("loss-chart-desc");
    if (!points.length && !validation.length) return;
    var W = 640, H = 240, L = 44, R = 10, T = 10, B = 24;
    var all = points.concat(validation);
    var xs = all.map(function (p) { return p[0]; }), ys = all.map(function (p) { return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    // A loss axis from zero: how far the loss fell is seen at its true size.
    var y0 = 0, y1 = Math.max.apply(null, ys) * 1.05 || 1;
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
    add("text", { x: 2, y: H - B }, "0");
    add("text", { x: L, y: H - 6 }, "step " + x0);
    add("text", { x: W - R - 60, y: H - 6 }, "step " + x1);
    epochs.forEach(function (e) {
      add("line", { x1: X(e[0]), y1: T, x2: X(e[0]), y2: H - B, "class": "epoch" });
      add("text", { x: X(e[0]) - 3, y: T + 8, "text-anchor": "end", "class": "epoch-label" }, "epoch " + e[1]);
    });
    function path(list) { return list.map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" "); }
    if (points.length) add("polyline", { "class": "loss", points: path(points) });
    if (validation.length) {
      add("polyline", { "class": "validation", points: path(validation) });
      validation.forEach(function (p) { add("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, "class": "validation-point" }); });
    }
    var text = "";
    if (points.length) {
      var last = points[points.length - 1];
      text = points.length + " points; loss went from " + points[0][1].toFixed(4) + " to " + last[1].toFixed(4) +
        " by step " + last[0] + (epochs.length ? " (" + epochs.length + " epoch" + (epochs.length > 1 ? "s" : "") + " marked)" : "") + ".";
    }
    if (validation.length) {
      text += (text ? " " : "") + "Validation loss (dots, once per epoch): " +
        validation.map(function (p) { return p[1].toFixed(4); }).join(", ") + ".";
    }
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
    document.getElementById("run-scores").textContent = Potato.scores(run.scores_text);
    document.getElementById("run-device").textContent = run.gpu || "–";
    ended = ["succeeded", "failed", "cancelled"].indexOf(run.state) >= 0;
    runState = run.state;
    var files = document.getElementById("run-artifact-uri");
    if (run.artifact_uri) files.textContent = run.artifact_uri;
    else if (ended && run.state !== "succeeded") files.textContent = "none: the run " + how(run.state) + " before it saved a model";
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
    // A cancelled run says who asked (its error) and when.
    err.textContent = (run.error || "") + (run.state === "cancelled" && run.cancel_requested_at ?
      " (requested " + Potato.time(run.cancel_requested_at) + ")" : "");
    retractState(run);
    gateState(run);
    learningCurves(run.curves || {});
  }

  function artifacts(list) {
    var ul = document.getElementById("artifacts");
    if (!list.length) {
      // Nothing more comes once a run has ended without a model: say so instead of "None yet".
      if (ended && runState !== "succeeded" && !ul.dataset.final) {
        ul.dataset.final = "1";
        ul.textContent = "";
        ul.appendChild(Potato.el("li", { "class": "hint" }, "None: the run " + how(runState) + " before it saved a model."));
      }
      return;
    }
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

  // An SVG element with attributes (and text), appended to parent.
  function svgEl(parent, tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e); return e;
  }
  function chart(w, h, title, desc) {
    var svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("width", w); svg.setAttribute("height", h);
    svg.setAttribute("role", "img");
    svgEl(svg, "title", {}, title);
    svgEl(svg, "desc", {}, desc);
    return svg;
  }
  function short(label) { return label.length > 12 ? label.slice(0, 11) + "…" : label; }

  // Rows: gold label; columns: predicted. A cell's shade is its share of the row.
  function confusionMatrix(name, s) {
    var k = s.labels.length, cell = Math.max(28, Math.min(56, Math.floor(360 / k))), L = 96, T = 40;
    var W = L + k * cell + 10, H = T + k * cell + 28;
    var right = 0;
    s.confusion.forEach(function (row, i) { right += row[i]; });
    var svg = chart(W, H, "Confusion matrix of " + name,
      s.n + " held-out items; " + right + " predicted right (the diagonal). Rows: the annotators' label; columns: the model's.");
    svg.setAttribute("class", "confusion");
    svgEl(svg, "text", { x: L, y: 12, "class": "muted" }, "predicted →");
    svgEl(svg, "text", { x: 2, y: T - 6, "class": "muted" }, "gold ↓");
    s.labels.forEach(function (label, j) {
      svgEl(svg, "text", { x: L + j * cell + cell / 2, y: T - 6, "text-anchor": "middle" }, short(label));
      svgEl(svg, "text", { x: L - 6, y: T + j * cell + cell / 2 + 4, "text-anchor": "end" }, short(label));
    });
    s.confusion.forEach(function (row, i) {
      var total = row.reduce(function (a, b) { return a + b; }, 0) || 1;
      row.forEach(function (count, j) {
        var share = count / total;
        var hue = i === j ? "17,99,41" : "180,35,24";
        var g = svgEl(svg, "g", { "class": "cell-group" });
        svgEl(g, "rect", { x: L + j * cell, y: T + i * cell, width: cell, height: cell, "class": "cell",
                           fill: "rgba(" + hue + "," + (0.08 + 0.8 * share).toFixed(2) + ")" });
        svgEl(g, "text", { x: L + j * cell + cell / 2, y: T + i * cell + cell / 2 + 4, "text-anchor": "middle",
                           "class": "count", style: share > 0.5 ? "fill:#fff" : "" }, String(count));
        svgEl(g, "title", {}, "gold " + s.labels[i] + ", predicted " + s.labels[j] + ": " + count);
      });
    });
    svgEl(svg, "text", { x: L, y: H - 8, "class": "muted" },
      "accuracy " + (s.accuracy === null ? "–" : s.accuracy.toFixed(3)) + (s.missing ? "; " + s.missing + " without a prediction" : ""));
    return svg;
  }

  // Confidence bins against accuracy: a bar per bin before calibration and, when a calibration was fitted,
  // one after it beside it; each bar says how many held-out items its bin holds.
  function reliabilityDiagram(name, s) {
    var W = 340, H = 320, L = 40, R = 10, T = 52, B = 40;
    var cal = s.calibration && s.calibration.reliability_after ? s.calibration : null;
    var ece = "ECE " + fixed(s.ece) + (cal ? " before, " + fixed(cal.ece_after) + " after calibration" : "");
    var desc = "ECE " + (s.ece === null ? "–" : s.ece.toFixed(3)) + " over " + s.n + " held-out items";
    if (cal) desc += "; after calibration (" + (cal.kept ? "kept" : "backed out") + ", run " + cal.by_run + ") ECE " +
      cal.ece_after.toFixed(3) + " out of fold";
    var svg = chart(W, H, "Reliability diagram of " + name, desc + ". The dashed diagonal is perfect calibration.");
    svg.setAttribute("class", "reliability");
    function X(v) { return L + v * (W - L - R); }
    function Y(v) { return H - B - v * (H - T - B); }
    svgEl(svg, "line", { x1: X(0), y1: Y(0), x2: X(1), y2: Y(0), "class": "axis", stroke: "#57606a" });
    svgEl(svg, "line", { x1: X(0), y1: Y(0), x2: X(0), y2: Y(1), "class": "axis", stroke: "#57606a" });
    svgEl(svg, "line", { x1: X(0), y1: Y(0), x2: X(1), y2: Y(1), "class": "diagonal" });
    [0, 0.5, 1].forEach(function (v) {
      svgEl(svg, "text", { x: X(v), y: H - B + 14, "text-anchor": "middle", "class": "muted" }, String(v));
      svgEl(svg, "text", { x: L - 4, y: Y(v) + 4, "text-anchor": "end", "class": "muted" }, String(v));
    });
    svgEl(svg, "text", { x: X(0.5), y: H - 6, "text-anchor": "middle", "class": "muted" }, "confidence");
    svgEl(svg, "text", { x: 4, y: T - 8, "class": "muted" }, "accuracy");
    svgEl(svg, "text", { x: L, y: 14, "class": "ece" }, ece);
    function bars(bins, cls, half) {
      bins.forEach(function (b) {
        if (!b.n) return;
        var width = (X(b.hi) - X(b.lo) - 2) / (cal ? 2 : 1), x = X(b.lo) + 1 + (half ? width : 0);
        var bar = svgEl(svg, "rect", { x: x, y: Y(b.accuracy), width: width, height: Y(0) - Y(b.accuracy), "class": cls });
        svgEl(bar, "title", {}, (cls === "after" ? "after calibration, " : "") + b.lo + "–" + b.hi + ": " + b.n +
          " items, mean confidence " + b.confidence + ", accuracy " + b.accuracy);
        svgEl(svg, "text", { x: x + width / 2, y: Y(b.accuracy) - 3, "text-anchor": "middle", "class": "bin-count " + cls + "-count" },
          String(b.n));
      });
    }
    bars(s.reliability, "before", false);
    if (cal) bars(cal.reliability_after, "after", true);
    svgEl(svg, "text", { x: L, y: 30, "class": "muted" },
      "blue: before" + (cal ? "; green: after" + (cal.kept ? "" : " (backed out)") : "") + "; numbers: items per bin");
    return svg;
  }

  // Per label, from the confusion matrix: how often the model is right when it says it (precision), how many
  // of the label's items it finds (recall), and their harmonic mean (F1).
  function labelScores(name, s) {
    var table = Potato.el("table", { "class": "label-scores" });
    table.appendChild(Potato.el("caption", {}, name + ": per label, on " + s.n + " held-out items"));
    var head = Potato.el("tr");
    ["Label", "Held out", "Predicted", "Precision", "Recall", "F1"].forEach(function (h) {
      head.appendChild(Potato.el("th", { scope: "col" }, h));
    });
    table.appendChild(head);
    s.labels.forEach(function (label, i) {
      var gold = s.confusion[i].reduce(function (a, b) { return a + b; }, 0);
      var predicted = s.confusion.reduce(function (a, row) { return a + row[i]; }, 0);
      var tp = s.confusion[i][i];
      var p = predicted ? tp / predicted : null, r = gold ? tp / gold : null;
      var f = p !== null && r !== null ? (p + r ? 2 * p * r / (p + r) : 0) : null;
      var tr = Potato.el("tr");
      [label, String(gold), String(predicted), fixed(p), fixed(r), fixed(f)].forEach(function (v) {
        tr.appendChild(Potato.el("td", {}, v));
      });
      table.appendChild(tr);
    });
    return table;
  }

  // The trivial baseline: always answering the label most held-out items have. A model is only worth its
  // accuracy above that.
  function baseline(s) {
    var counts = s.confusion.map(function (row) { return row.reduce(function (a, b) { return a + b; }, 0); });
    var total = counts.reduce(function (a, b) { return a + b; }, 0);
    if (!total) return null;
    var best = counts.indexOf(Math.max.apply(null, counts));
    var share = counts[best] / total;
    var text = "Accuracy " + fixed(s.accuracy) + "; always answering “" + s.labels[best] + "” (the most common label of these " +
      total + " held-out items) scores " + fixed(share) + ".";
    var worse = typeof s.accuracy === "number" && s.accuracy <= share;
    return Potato.el("p", { "class": "baseline" + (worse ? " error" : "") },
      text + (worse ? " The model does no better than that." : ""));
  }

  function fixed(x) { return typeof x === "number" ? x.toFixed(3) : "–"; }

  // A multilabel schema: one 2×2 confusion matrix per label (rows: the annotators ticked it or not).
  function perLabel(name, s) {
    var pictures = [Potato.el("p", {}, "Exact sets: " + fixed(s.exact_set) + " of " + s.n + " held-out items.")];
    s.per_label.forEach(function (c) {
      var n = c.tp + c.fp + c.fn + c.tn;
      pictures.push(confusionMatrix(name + ": " + c.label, { labels: ["on", "off"], n: n, missing: 0,
        confusion: [[c.tp, c.fn], [c.fp, c.tn]], accuracy: n ? (c.tp + c.tn) / n : null }));
    });
    return pictures;
  }

  // A span schema: exact-match spans per label, with precision, recall and F1.
  function spanMatches(name, s) {
    var table = Potato.el("table", { "class": "span-matches" });
    table.appendChild(Potato.el("caption", {}, name + ": spans matched exactly"));
    var head = Potato.el("tr");
    ["Label", "Matched", "Extra", "Missed", "Precision", "Recall", "F1"].forEach(function (h) {
      head.appendChild(Potato.el("th", { scope: "col" }, h));
    });
    table.appendChild(head);
    s.per_label.forEach(function (c) {
      var p = c.tp + c.fp ? c.tp / (c.tp + c.fp) : null, r = c.tp + c.fn ? c.tp / (c.tp + c.fn) : null;
      var f = p !== null && r !== null && p + r ? 2 * p * r / (p + r) : null;
      var tr = Potato.el("tr");
      [c.label, String(c.tp), String(c.fp), String(c.fn), fixed(p), fixed(r), fixed(f)].forEach(function (v) {
        tr.appendChild(Potato.el("td", {}, v));
      });
      table.appendChild(tr);
    });
    return table;
  }

  // A learning curve: the main holdout score after training on 25, 50, 75 and 100 % of the labels.
  function learningCurves(curves) {
    var box = document.getElementById("learning-curves");
    var key = JSON.stringify(curves);
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    box.textContent = "";
    Object.keys(curves).sort().forEach(function (name) {
      var c = curves[name], W = 420, H = 200, L = 48, R = 12, T = 12, B = 36;
      var values = c.points.map(function (p) { return p[c.key]; }).filter(function (v) { return typeof v === "number"; });
      if (!values.length) return;
      var top = Math.max.apply(null, values.concat([c.higher_is_better && Math.max.apply(null, values) <= 1 ? 1 : 0]));
      var svg = chart(W, H, "Learning curve of " + name, c.text);
      svg.setAttribute("class", "learning-curve");
      function X(share) { return L + share * (W - L - R); }
      function Y(v) { return H - B - (top ? v / top : 0) * (H - T - B); }
      svgEl(svg, "line", { x1: L, y1: Y(0), x2: W - R, y2: Y(0), "class": "axis" });
      svgEl(svg, "line", { x1: L, y1: T, x2: L, y2: Y(0), "class": "axis" });
      svgEl(svg, "text", { x: L - 6, y: Y(0) + 4, "text-anchor": "end" }, "0");
      svgEl(svg, "text", { x: L - 6, y: Y(top) + 4, "text-anchor": "end" }, top.toFixed(2));
      var pts = c.points.filter(function (p) { return typeof p[c.key] === "number"; });
      svgEl(svg, "polyline", { points: pts.map(function (p) { return X(p.share).toFixed(1) + "," + Y(p[c.key]).toFixed(1); }).join(" "),
                               "class": "curve", fill: "none" });
      pts.forEach(function (p) {
        svgEl(svg, "circle", { cx: X(p.share), cy: Y(p[c.key]), r: 3, "class": "curve-point" });
        svgEl(svg, "text", { x: X(p.share), y: H - B + 16, "text-anchor": "middle", "class": "curve-label" },
              Math.round(100 * p.share) + " % (" + p.items + ")");
      });
      var figure = Potato.el("figure", { "class": "learning-curve" });
      figure.appendChild(svg);
      figure.appendChild(Potato.el("figcaption", { "class": "curve-caption" }, c.text));
      box.appendChild(Potato.el("h3", {}, "Learning curve: " + name + " (" + c.metric + " on the holdout)"));
      box.appendChild(figure);
    });
  }

  function evaluation() {
    return Potato.request("GET", root.dataset.evaluation).then(function (data) {
      var box = document.getElementById("evaluation");
      if (!data.available) {
        box.textContent = "This run has no holdout evaluation (it did not finish, or its directory was deleted).";
        return;
      }
      box.textContent = "";
      Object.keys(data.schemas).forEach(function (name) {
        var s = data.schemas[name];
        box.appendChild(Potato.el("h3", {}, name));
        var cal = s.calibration;
        if (cal) box.appendChild(Potato.el("p", { "class": "calibration" },
          "Calibration by run " + cal.by_run + ": " + (cal.kept ? "kept" : "backed out") + " — " + cal.reason +
          (cal.threshold !== null ? ". " + Math.round(cal.target_precision * 100) + " % precision at confidence ≥ " + cal.threshold : "")));
        var row = Potato.el("div", { "class": "pictures" });
        if (!s.n) row.appendChild(Potato.el("p", { "class": "hint" }, "No held-out item of " + name + " had a prediction."));
        else if (s.kind === "multilabel") perLabel(name, s).forEach(function (p) { row.appendChild(p); });
        else if (s.kind === "span") row.appendChild(spanMatches(name, s));
        else if (s.kind === "continuous") row.appendChild(Potato.el("p", {}, "Mean absolute error " + fixed(s.mae) + " over " + s.n + " held-out items."));
        else if (s.kind === "text") row.appendChild(Potato.el("p", {}, "Exact answers: " + fixed(s.exact_match) + " of " + s.n + " held-out items."));
        else if (s.kind === "comparison") {
          row.appendChild(Potato.el("p", { "class": "agreement" }, "Prefers the annotators' majority on " +
            fixed(s.agreement) + " of " + s.decided + " held-out comparisons with one (" + (s.n - s.decided) +
            " split evenly); agrees with " + fixed(s.annotator_agreement) + " of each annotator's choices."));
          row.appendChild(reliabilityDiagram(name, s));
        }
        else if (s.kind === "best_worst") {
          row.appendChild(Potato.el("p", { "class": "agreement" }, "Picks the annotators' best on " +
            fixed(s.best_agreement) + " of " + s.decided + " held-out tuples with one, their worst on " +
            fixed(s.worst_agreement) + "; agrees with " + fixed(s.annotator_agreement) + " of each annotator's picks."));
          row.appendChild(reliabilityDiagram(name, s));
        }
        else if (s.kind === "ranking") {
          row.appendChild(Potato.el("p", { "class": "agreement" }, "Orders " + fixed(s.agreement) +
            " of the pairs in held-out annotators' orders as they did; Kendall's tau with their Borda count " +
            fixed(s.kendall_tau) + ", Spearman's rho " + fixed(s.spearman) + "; puts first the label their Borda " +
            "count puts first on " + fixed(s.top_agreement) + " of " + s.decided + " held-out items with one."));
          row.appendChild(reliabilityDiagram(name, s));
        }
        else {
          var base = baseline(s);
          if (base) box.appendChild(base);
          row.appendChild(confusionMatrix(name, s)); row.appendChild(reliabilityDiagram(name, s));
          row.appendChild(labelScores(name, s));
        }
        box.appendChild(row);
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
        if (ev.kind === "validation" && addValidation(ev.data || {})) grew = true;
        var d = describe(ev);
        if (d) line(d[0], d[1]);
      });
      after = data.next_after;
      if (grew) draw();
      facts(data.run);
      artifacts(data.artifacts);
      if (ended && !points.length && !validation.length)
        caption.textContent = "The run reported no training progress" +
          (data.run.state === "succeeded" ? "." : ": it " + how(data.run.state) + " before it trained.");
      if (ended && !predictionsShown) { predictionsShown = true; predictions(); evaluation(); }
      if (data.more_events) return refresh();
      // After the end, poll a few more times for the last log lines, then stop.
      if (ended && ++finishedPolls > 3) return false;
    });
  }
  Potato.poll(refresh, 1000);
})();
