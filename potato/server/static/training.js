/* The Training page: Runs on + Check, start a run, the live Runs table with step rows. */
"use strict";
(function () {
  var byId = document.getElementById.bind(document);
  var form = byId("start-form"), backendSelect = byId("backend"), checkButton = byId("check-button");
  var report = byId("check-report"), message = byId("start-message");
  var table = byId("runs"), tbody = table.querySelector("tbody"), empty = byId("runs-empty"), note = byId("runs-note");
  var backendsApi = checkButton.dataset.api;
  var rows = {};  // run id -> {main, step}

  checkButton.addEventListener("click", function () {
    var name = backendSelect.value;
    checkButton.disabled = true;
    report.hidden = false;
    report.className = "report";
    report.querySelector(".report-verdict").textContent = "Checking " + name + "…";
    report.querySelector(".report-lines").textContent = "";
    Potato.request("POST", backendsApi + "/" + encodeURIComponent(name) + "/check", undefined, form)
      .then(function (data) {
        var ok = data._status === 200 && data.ok;
        report.className = "report " + (ok ? "ok" : "bad");
        report.querySelector(".report-verdict").textContent =
          data._status !== 200 ? "The check failed" : (ok ? "A run can start on " + name : "A run cannot start on " + name);
        report.querySelector(".report-lines").textContent = data.report ? data.report.join("\n") : (data.error || "");
      })
      .catch(function () { report.querySelector(".report-verdict").textContent = "The server did not answer"; })
      .then(function () { checkButton.disabled = false; });
  });

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var schemas = Array.prototype.map.call(form.querySelectorAll("input[name=schemas]:checked"), function (c) { return c.value; });
    var body = { schemas: schemas, backend: backendSelect.value };
    var trainer = document.getElementById("trainer").value;
    if (trainer) body.trainer = trainer;  // none: each schema is trained by its kind's default trainer
    if (document.getElementById("curve").checked) body.options = { curve: true };
    var button = document.getElementById("start-button");
    button.disabled = true;
    message.className = "";
    message.textContent = "Starting…";
    Potato.request("POST", form.dataset.api, body, form).then(function (data) {
      if (data._status === 201) {
        message.textContent = "Run " + data.run.id + " " + data.run.state + " on " + data.run.ran_on.name + ".";
        refresh();
      } else {
        message.className = "error";
        message.textContent = data.error || ("The server answered " + data._status);
      }
    }).catch(function () { message.className = "error"; message.textContent = "The server did not answer"; })
      .then(function () { button.disabled = false; });
  });

  // Runs side by side: the ticked runs' compare page, oldest first.
  var compareButton = byId("compare-button");
  function picked() {
    return Array.prototype.map.call(tbody.querySelectorAll("input.compare-pick:checked"), function (c) {
      return Number(c.value); }).sort(function (a, b) { return a - b; });
  }
  function pickedChanged() { compareButton.disabled = picked().length < 2; }
  compareButton.addEventListener("click", function () {
    window.location.href = compareButton.dataset.page + "?runs=" + picked().join(",");
  });

  function cancel(id, button) {
    if (!Potato.confirmCancel(id, table.dataset.grace)) return;
    button.disabled = true;
    Potato.request("POST", table.dataset.api + "/" + id + "/cancel", undefined, form).then(function (data) {
      if (data._status !== 200) { note.textContent = data.error || "Cancel failed"; button.disabled = false; }
      refresh();
    });
  }

  function makeRow(run) {
    var main = Potato.el("tr", { "data-run": run.id, "id": "run-" + run.id });
    var link = Potato.el("a", { href: table.dataset.runPage + run.id }, "Run " + run.id);
    var pick = Potato.el("input", { type: "checkbox", "class": "compare-pick", value: String(run.id),
                                    "aria-label": "Compare run " + run.id });
    pick.addEventListener("change", pickedChanged);
    var first = Potato.el("td"); first.appendChild(pick); first.appendChild(document.createTextNode(" "));
    first.appendChild(link); main.appendChild(first);
    ["state", "trigger", "trainer", "ran-on", "queue", "started", "duration", "predictions", "changed", "scores", "published"].forEach(function (k) {
      main.appendChild(Potato.el("td", { "class": "col-" + k }));
    });
    var actions = Potato.el("td", { "class": "col-actions" });
    var button = Potato.el("button", { type: "button", "class": "danger cancel", "aria-label": "Cancel run " + run.id }, "Cancel run");
    button.addEventListener("click", function () { cancel(run.id, button); });
    actions.appendChild(button);
    main.appendChild(actions);
    var step = Potato.el("tr", { "class": "step-row", "id": "step-" + run.id });
    var cell = Potato.el("td", { colspan: "13" });
    var label = Potato.el("span", { "class": "visually-hidden" }, "Run " + run.id + " step: ");
    var text = Potato.el("span", { "class": "step", "id": "step-text-" + run.id, "aria-live": "polite" });
    var bar = Potato.el("progress", { max: "1", "aria-labelledby": "step-text-" + run.id });
    cell.appendChild(label); cell.appendChild(text); cell.appendChild(bar);
    step.appendChild(cell);
    return { main: main, step: step };
  }

  function set(row, cls, text) {
    var td = row.querySelector(".col-" + cls);
    if (td.textContent !== text) td.textContent = text;
  }

  // The repo the run's model was last published to, as a link; or how far an upload is.
  function published(td, p) {
    var last = p && p.latest;
    var key = p ? [p.state, p.bytes, last && last.commit].join("|") : "";
    if (td.dataset.key === key) return;
    td.dataset.key = key;
    td.textContent = "";
    if (p && p.state === "uploading") td.textContent = p.text;
    else if (last) td.appendChild(Potato.el("a", { href: last.url, title: "commit " + last.commit + " by " + last.by }, last.repo));
  }

  function update(r, run) {
    var state = r.main.querySelector(".col-state");
    var stateText = run.state + (run.cancel_requested && run.active ? " (cancelling)" : "");
    if (state.textContent !== stateText) { state.textContent = stateText; state.className = "col-state state state-" + run.state; }
    set(r.main, "trigger", run.trigger);
    set(r.main, "trainer", run.trainers_text);
    set(r.main, "ran-on", run.ran_on.name);
    r.main.querySelector(".col-ran-on").title = run.ran_on.description;
    set(r.main, "queue", run.queue_position ? "#" + run.queue_position : "");
    set(r.main, "started", Potato.time(run.started_at));
    set(r.main, "duration", Potato.duration(run.duration_s));
    // live / live, pinned / held back (the quality gate's words in its title) / retracted.
    set(r.main, "predictions", run.predictions_state === "-" ? "" : run.predictions_state);
    r.main.querySelector(".col-predictions").title = (run.gate_text || []).join("\n");
    // The stopping signal: the share of unlabelled items whose predicted label changed since the previous run.
    set(r.main, "changed", run.changed === "-" ? "" : run.changed);
    r.main.querySelector(".col-changed").title = (run.changed_text || []).join("\n");
    set(r.main, "scores", run.error && run.state === "failed" ? run.error : Potato.scores(run.scores_text));
    published(r.main.querySelector(".col-published"), run.publication);
    var open = run.state === "queued" || run.state === "running";
    var button = r.main.querySelector("button.cancel");
    button.hidden = !open;
    if (open && !run.cancel_requested) button.disabled = false;
    if (run.cancel_requested) button.disabled = true;
    var showStep = run.state === "running" || (run.state === "queued" && run.active);
    r.step.hidden = !showStep;
    r.main.classList.toggle("has-step", showStep);
    if (showStep) {
      var text = r.step.querySelector(".step");
      var t = run.step || "starting";
      if (run.progress_text) t += " — " + run.progress_text;
      if (text.textContent !== t) text.textContent = t;
      var bar = r.step.querySelector("progress");
      if (typeof run.progress === "number") bar.value = run.progress; else bar.removeAttribute("value");
    }
  }

  function render(data) {
    var seen = {};
    var anchor = null;
    data.runs.forEach(function (run) {
      seen[run.id] = true;
      var r = rows[run.id];
      if (!r) { r = rows[run.id] = makeRow(run); }
      update(r, run);
      // Keep the rows in the API's order (newest first) without rebuilding them.
      var before = anchor ? anchor.nextSibling : tbody.firstChild;
      if (before !== r.main) tbody.insertBefore(r.main, before);
      if (r.main.nextSibling !== r.step) tbody.insertBefore(r.step, r.main.nextSibling);
      anchor = r.step;
    });
    Object.keys(rows).forEach(function (id) {
      if (!seen[id]) { rows[id].main.remove(); rows[id].step.remove(); delete rows[id]; }
    });
    empty.hidden = data.runs.length > 0;
    note.textContent = data.total > data.runs.length ? "Showing the newest " + data.runs.length + " of " + data.total + " runs." : "";
  }

  // What annotators see: the newest written-back run's report, in the server's words.
  var writeback = byId("writeback"), leastCertain = byId("least-certain");
  function showWriteback(data) {
    var key = JSON.stringify(data);
    if (writeback.dataset.key === key) return;
    writeback.dataset.key = key;
    byId("writeback-run").textContent = data.available
      ? "The predictions of run " + data.run_id + ", the newest written back:" : "No run has written predictions back yet.";
    var list = byId("writeback-lines");
    list.textContent = "";
    (data.held_back || []).forEach(function (line) { list.appendChild(Potato.el("li", { "class": "held-back" }, line)); });
    (data.lines || []).forEach(function (line) { list.appendChild(Potato.el("li", {}, line)); });
    (data.changed || []).forEach(function (line) { list.appendChild(Potato.el("li", { "class": "changed" }, line)); });
    var body = leastCertain.querySelector("tbody");
    body.textContent = "";
    (data.least_certain || []).forEach(function (item) {
      var tr = Potato.el("tr");
      tr.appendChild(Potato.el("td", {}, item.id));
      tr.appendChild(Potato.el("td", { "class": "item-text" }, item.text || ""));  // older reports have ids only
      tr.appendChild(Potato.el("td", {}, item.confidence === null ? "\u2014" : item.confidence.toFixed(3)));
      tr.appendChild(Potato.el("td", {}, Object.keys(item.predictions).map(function (s) {
        return s + ": " + item.predictions[s]; }).join("; ")));
      body.appendChild(tr);
    });
    leastCertain.hidden = !(data.least_certain && data.least_certain.length);
  }

  var autoRetrain = document.getElementById("auto-retrain");
  function refresh() {
    Potato.request("GET", writeback.dataset.api).then(function (data) {
      if (data._status === 200) showWriteback(data);
    });
    Potato.request("GET", autoRetrain.dataset.api).then(function (data) {
      if (data._status !== 200) return;
      var text = data.enabled ? "Auto-retrain: " + data.text : "";
      if (autoRetrain.textContent !== text) autoRetrain.textContent = text;
    });
    return Potato.request("GET", table.dataset.api + "?limit=50").then(function (data) {
      if (data._status === 401) { window.location.reload(); return false; }
      if (data.runs) render(data);
    });
  }
  Potato.poll(refresh, 1000);
})();
