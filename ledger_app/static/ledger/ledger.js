// Verify a chain in steps: each POST checks the next slice and hands back a signed cursor; the bar shows how far.
(function () {
  "use strict";
  const form = document.getElementById("lg-verify-form");
  if (!form) return;
  const button = document.getElementById("lg-verify");
  const box = document.getElementById("lg-progress");
  const bar = document.getElementById("lg-progress-bar");
  const text = document.getElementById("lg-progress-text");
  const result = document.getElementById("lg-result");
  const badge = document.getElementById("lg-badge");
  const token = form.querySelector("input[name=csrfmiddlewaretoken]").value;

  function show(report) {
    result.replaceChildren();
    const line = document.createElement("p");
    if (report.ok) {
      line.textContent = "Verified: " + report.entries + " entries, every hash, link and signature checks out.";
      badge.className = "badge lg-verified";
      badge.textContent = "verified";
    } else {
      const kinds = report.breaks.length;
      line.textContent = "Broken: " + kinds + (kinds === 1 ? " kind" : " kinds") + " of break found; the first of each:";
      badge.className = "badge lg-broken";
      badge.textContent = "broken at seq " + report.breaks[0].seq;
      const list = document.createElement("ul");
      list.className = "lg-breaks";
      for (const found of report.breaks) {
        const item = document.createElement("li");
        const kind = document.createElement("strong");
        kind.textContent = found.kind;
        item.append(kind, " at seq " + found.seq + " (" + (report.counts[found.kind] || 1) + "×): " + found.message);
        list.append(item);
      }
      result.append(line, list);
      return;
    }
    result.append(line);
  }

  async function step(cursor) {
    const body = new URLSearchParams({cursor: cursor});
    const response = await fetch(form.action, {
      method: "POST", body: body, credentials: "same-origin",
      headers: {"X-CSRFToken": token, "Accept": "application/json"},
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error ? answer.error.message : "HTTP " + response.status);
    return answer;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    button.disabled = true;
    box.hidden = false;
    result.replaceChildren();
    let cursor = "";
    try {
      for (;;) {
        const answer = await step(cursor);
        bar.max = answer.total || 1;
        bar.value = answer.checked;
        text.textContent = answer.checked.toLocaleString() + " of " + answer.total.toLocaleString() + " entries checked";
        if (answer.done) { show(answer.report); break; }
        cursor = answer.cursor;
      }
    } catch (error) {
      text.textContent = "Verification stopped: " + error.message;
    } finally {
      button.disabled = false;
    }
  });
})();
