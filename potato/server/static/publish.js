/* The run page's Model panel: download the model, publish it to the Hugging Face Hub, follow the upload.
   Shown once the run has succeeded. The download is offered whenever the model is on this server; without a
   Hub token the publish part says so quietly. A run whose model is not here says why (and the fix) instead. */
"use strict";
(function () {
  var box = document.getElementById("publish");
  var ready = document.getElementById("publish-ready");
  var refusal = document.getElementById("publish-refusal");
  var form = document.getElementById("publish-form");
  var button = document.getElementById("publish-button");
  var status = document.getElementById("publish-status");
  var bar = document.getElementById("publish-progress");
  var error = document.getElementById("publish-error");
  var base = document.getElementById("publish-base");
  var note = document.getElementById("publish-hub-note");

  function showError(text) { error.hidden = !text; error.textContent = text || ""; }

  function render(p) {
    status.textContent = "";
    bar.hidden = true;
    if (!p) return false;
    if (p.state === "uploading") {
      status.textContent = p.text;
      bar.hidden = false;
      bar.value = p.total ? (p.bytes || 0) / p.total : 0;
      button.disabled = true;
      showError("");
      return true;
    }
    button.disabled = false;
    if (p.state === "failed") showError("Publishing to " + p.repo + " failed: " + p.error);
    else showError("");
    var last = p.latest;
    if (last) {
      status.appendChild(document.createTextNode("Published to "));
      status.appendChild(Potato.el("a", { href: last.url, id: "published-link" }, last.repo));
      status.appendChild(document.createTextNode(" at commit " + last.commit.slice(0, 7) + " by " + last.by +
        (p.state === "published" ? (p.private ? " (private)" : " (public)") : "") + "."));
    }
    return false;
  }

  function refresh() {
    return Potato.request("GET", box.dataset.api).then(function (data) {
      if (data._status === 401) { window.location.reload(); return false; }
      if (data._status !== 200) return;
      if (data.run_state === "queued" || data.run_state === "running") return;  // ask again later
      if (data.run_state !== "succeeded") return false;  // no model: the panel stays hidden
      box.hidden = false;
      document.getElementById("publish-hub").textContent = data.hub;
      refusal.hidden = !data.refusal;
      refusal.textContent = data.refusal || "";
      // The download needs only the model here; publishing needs the Hub too, and a missing token is
      // a quiet note in that part, not an error over a run that succeeded.
      document.getElementById("download").hidden = !data.downloadable;
      ready.hidden = !data.downloadable;
      note.hidden = !data.hub_note;
      note.textContent = data.hub_note || "";
      if (data.base_model && !base.value) base.value = data.base_model;
      base.required = data.kind === "lora" && !data.base_model;
      return render(data.publication) ? undefined : false;  // poll on while an upload runs
    });
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var body = { repo: document.getElementById("publish-repo").value.trim(),
                 private: !document.getElementById("publish-public").checked,
                 revision: document.getElementById("publish-revision").value.trim() || "main" };
    ["base_model", "license"].forEach(function (name) {
      var value = form.elements[name].value.trim();
      if (value) body[name] = value;
    });
    button.disabled = true;
    showError("");
    Potato.request("POST", box.dataset.api, body, box).then(function (data) {
      if (data._status !== 202) { showError(data.error || ("The server answered " + data._status)); button.disabled = false; return; }
      render(data.publication);
      Potato.poll(refresh, 1000);
    }).catch(function () { showError("The server did not answer"); button.disabled = false; });
  });

  Potato.poll(refresh, 1000);
})();
