// Live approval cards over /ws/approvals/: the server is the truth; this page only shows and sends decisions.
"use strict";

(function () {
  const root = document.getElementById("ap-cards");
  if (!root) return;
  const empty = document.getElementById("ap-empty");
  const connection = document.getElementById("ap-connection");
  const notifyBox = document.getElementById("ap-notify");
  const soundBox = document.getElementById("ap-sound");
  const helpButton = document.getElementById("ap-help-button");
  const help = document.getElementById("ap-help");
  const me = root.dataset.me;
  const FOLD_AT = 160;
  const RESOLVED_LINGER_MS = 4000;
  const baseTitle = document.title;

  const cards = new Map(); // id -> {card, el, parts}
  let selectedId = null;
  let clockOffset = 0; // server clock minus ours, in ms
  let socket = null;
  let retries = 0;

  const prefs = {
    notify: localStorage.getItem("aleph.approvals.notify") === "1",
    sound: localStorage.getItem("aleph.approvals.sound") !== "0",
  };

  // -- small DOM helpers ---------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  // Arguments, pretty: nested keys and values; long or multi-line strings fold behind a summary.
  function renderValue(value) {
    if (value === null) return h("span", { class: "ap-null", text: "null" });
    if (Array.isArray(value)) {
      if (!value.length) return h("span", { class: "ap-punct", text: "[]" });
      return h("ol", { class: "ap-list", start: "0" }, value.map((item) => h("li", {}, renderValue(item))));
    }
    if (typeof value === "object") {
      const keys = Object.keys(value);
      if (!keys.length) return h("span", { class: "ap-punct", text: "{}" });
      return h("dl", { class: "ap-obj" }, keys.map((key) => [h("dt", { text: key }), h("dd", {}, renderValue(value[key]))]));
    }
    if (typeof value === "string") {
      if (value.length > FOLD_AT || value.includes("\n")) {
        const head = value.split("\n")[0].slice(0, 80);
        return h(
          "details",
          { class: "ap-fold" },
          h("summary", {}, h("span", { class: "ap-str", text: JSON.stringify(head) + "…" }),
            h("span", { class: "muted", text: ` ${value.length} chars` })),
          h("pre", { class: "ap-full", text: value }),
        );
      }
      return h("span", { class: "ap-str", text: JSON.stringify(value) });
    }
    return h("span", { class: "ap-lit", text: String(value) });
  }

  // -- the cards -------------------------------------------------------------------------------

  function countdownText(card) {
    const left = Math.max(0, Date.parse(card.deadline) - (Date.now() + clockOffset));
    const seconds = Math.ceil(left / 1000);
    return { text: `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`, seconds };
  }

  function buildCard(card) {
    const floorOnly = card.asked_by === "floor";
    const button = (label, key, action, extra) =>
      h("button", { type: "button", class: extra, "data-action": action, title: `${label} (${key})`, onclick: () => act(card.id, action) },
        label, h("kbd", { text: key }));
    const parts = {};
    parts.countdown = h("span", { class: "ap-countdown", title: `deadline ${card.deadline}` });
    parts.outcome = h("p", { class: "ap-outcome", role: "status" });
    parts.any = h("input", { type: "checkbox", class: "ap-any", disabled: floorOnly });
    parts.untilInput = h("input", { type: "datetime-local", class: "ap-until-input", required: true });
    parts.untilForm = h("form", { class: "ap-inline", hidden: true, onsubmit: (e) => { e.preventDefault(); submitUntil(card.id); } },
      h("label", { text: "Approve until " }, parts.untilInput),
      h("button", { type: "submit", class: "ap-approve", text: "Approve until" }),
      h("button", { type: "button", class: "ap-secondary", text: "Cancel", onclick: () => closeForms(card.id) }));
    parts.reasonInput = h("input", { type: "text", class: "ap-reason", maxlength: "2000", placeholder: "Reason the agent will read", required: true });
    parts.denyForm = h("form", { class: "ap-inline", hidden: true, onsubmit: (e) => { e.preventDefault(); submitDeny(card.id); } },
      parts.reasonInput,
      h("button", { type: "submit", class: "ap-deny", text: "Deny" }),
      h("button", { type: "button", class: "ap-secondary", text: "Cancel", onclick: () => closeForms(card.id) }));
    const sessionButton = button("For this session", "s", "session", "ap-grant");
    if (!card.session) {
      sessionButton.disabled = true;
      sessionButton.title = "This call belongs to no session.";
    }
    parts.buttons = [
      button("Approve once", "a", "once", "ap-approve"),
      sessionButton,
      button("Always", "y", "always", "ap-grant"),
      button("Until…", "u", "until", "ap-grant"),
      button("Deny…", "d", "deny", "ap-deny"),
    ];
    if (floorOnly) {
      parts.buttons.slice(1, 4).forEach((b) => {
        b.disabled = true;
        b.title = "This tool always needs a person's confirmation: approve it once.";
      });
    }
    const el = h("article", { class: "ap-card", "data-id": card.id, tabindex: "0", onfocus: () => select(card.id), onclick: () => select(card.id) },
      h("header", { class: "ap-head" },
        h("div", {},
          h("code", { class: "ap-tool", text: card.tool }),
          h("span", { class: "ap-who" }, " requested by ", h("strong", { text: card.agent }), " in ", h("strong", { text: card.channel })),
          card.session ? h("span", { class: "muted", text: ` · session ${card.session}` }) : null),
        parts.countdown),
      h("p", { class: "ap-why" }, h("code", { class: "ap-rule", text: card.rule }), " ", card.reason),
      h("div", { class: "ap-args" }, renderValue(card.arguments)),
      h("div", { class: "ap-actions" }, parts.buttons,
        h("label", { class: "ap-toggle", title: "A grant from this decision covers any arguments, not just these" }, parts.any, " any arguments")),
      parts.untilForm, parts.denyForm, parts.outcome);
    return { card, el, parts, busy: false, resolved: false };
  }

  function refresh() {
    const live = [...cards.values()].filter((entry) => !entry.resolved).length;
    empty.hidden = cards.size > 0;
    document.title = live ? `(${live}) ${baseTitle}` : baseTitle;
    if (selectedId && !cards.has(selectedId)) selectedId = null;
    for (const [id, entry] of cards) entry.el.classList.toggle("ap-selected", id === selectedId);
  }

  function addCard(card, fresh) {
    if (cards.has(card.id) || card.status !== "pending") return;
    const entry = buildCard(card);
    cards.set(card.id, entry);
    root.prepend(entry.el);
    tick();
    if (!selectedId) selectedId = card.id;
    refresh();
    if (fresh) announce(card);
  }

  function describe(resolution) {
    const who = resolution.decided_by === me ? "you" : resolution.decided_by;
    const scope = resolution.scope && resolution.scope !== "once" ? ` (${resolution.scope})` : "";
    if (resolution.status === "approved") return `Approved by ${who}${scope}.`;
    if (resolution.status === "denied") return `Denied by ${who}${resolution.reason ? ": " + resolution.reason : "."}`;
    if (resolution.status === "expired") return "Expired: nobody decided before the deadline.";
    return "Cancelled: the call stopped waiting.";
  }

  function resolveCard(resolution) {
    const entry = cards.get(resolution.id);
    if (!entry || entry.resolved) return;
    entry.resolved = true;
    entry.el.classList.add("ap-resolved", `ap-${resolution.status}`);
    entry.parts.buttons.forEach((b) => { b.disabled = true; });
    closeForms(resolution.id);
    entry.parts.outcome.textContent = describe(resolution);
    if (selectedId === resolution.id) {
      const next = [...cards.values()].find((other) => !other.resolved);
      selectedId = next ? next.card.id : null;
    }
    refresh();
    setTimeout(() => {
      entry.el.remove();
      cards.delete(resolution.id);
      refresh();
    }, RESOLVED_LINGER_MS);
  }

  function tick() {
    for (const entry of cards.values()) {
      if (entry.resolved) continue;
      const left = countdownText(entry.card);
      entry.parts.countdown.textContent = left.text;
      entry.parts.countdown.classList.toggle("ap-urgent", left.seconds <= 15);
    }
  }
  setInterval(tick, 1000);

  // -- deciding --------------------------------------------------------------------------------

  function select(id) {
    selectedId = id;
    refresh();
  }

  function closeForms(id) {
    const entry = cards.get(id);
    if (!entry) return;
    entry.parts.untilForm.hidden = true;
    entry.parts.denyForm.hidden = true;
  }

  function send(id, body) {
    const entry = cards.get(id);
    if (!entry || entry.resolved || entry.busy) return;
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      entry.parts.outcome.textContent = "Not connected: the decision was not sent.";
      return;
    }
    entry.busy = true;
    entry.parts.buttons.forEach((b) => b.classList.add("ap-busy"));
    entry.parts.outcome.textContent = "Sending…";
    socket.send(JSON.stringify({ type: "decide", id, ...body }));
  }

  function act(id, action) {
    const entry = cards.get(id);
    if (!entry || entry.resolved) return;
    select(id);
    const match = entry.parts.any.checked ? "tool" : "arguments";
    if (action === "once") return send(id, { decision: "approve", scope: "once" });
    if (action === "session" || action === "always") {
      if (action === "session" && !entry.card.session) return;
      if (entry.card.asked_by === "floor") return;
      return send(id, { decision: "approve", scope: action, match });
    }
    if (action === "until") {
      if (entry.card.asked_by === "floor") return;
      closeForms(id);
      const inOneHour = new Date(Date.now() + 3600 * 1000 - new Date().getTimezoneOffset() * 60000);
      entry.parts.untilInput.value = inOneHour.toISOString().slice(0, 16);
      entry.parts.untilForm.hidden = false;
      entry.parts.untilInput.focus();
      return;
    }
    if (action === "deny") {
      closeForms(id);
      entry.parts.denyForm.hidden = false;
      entry.parts.reasonInput.focus();
    }
  }

  function submitUntil(id) {
    const entry = cards.get(id);
    const local = entry.parts.untilInput.value;
    if (!local) return;
    const match = entry.parts.any.checked ? "tool" : "arguments";
    send(id, { decision: "approve", scope: "until", until: new Date(local).toISOString(), match });
  }

  function submitDeny(id) {
    const entry = cards.get(id);
    const reason = entry.parts.reasonInput.value.trim();
    if (!reason) return entry.parts.reasonInput.focus();
    send(id, { decision: "deny", scope: "once", reason });
  }

  function decided(message) {
    const entry = cards.get(message.id);
    if (!entry) return;
    entry.busy = false;
    entry.parts.buttons.forEach((b) => b.classList.remove("ap-busy"));
    if (message.type === "decide.error") {
      entry.parts.outcome.textContent = message.error.message;
      const status = message.error.detail && message.error.detail.status;
      if (status) resolveCard({ id: message.id, status, decided_by: message.error.detail.decided_by });
    } else {
      entry.parts.outcome.textContent = "";
    }
  }

  // -- new-card signals: a notification and a sound, each switchable ---------------------------

  function announce(card) {
    if (prefs.sound) beep();
    if (prefs.notify && "Notification" in window && Notification.permission === "granted" && document.hidden) {
      const note = new Notification(`${card.tool} needs a decision`, { body: `${card.agent} in ${card.channel}: ${card.rule}`, tag: card.id });
      note.onclick = () => { window.focus(); select(card.id); note.close(); };
    }
  }

  let audio = null;
  function beep() {
    try {
      audio = audio || new (window.AudioContext || window.webkitAudioContext)();
      const tone = audio.createOscillator();
      const gain = audio.createGain();
      tone.frequency.value = 880;
      gain.gain.setValueAtTime(0.08, audio.currentTime);
      gain.gain.exponentialRampToValueAtTime(0.0001, audio.currentTime + 0.25);
      tone.connect(gain).connect(audio.destination);
      tone.start();
      tone.stop(audio.currentTime + 0.25);
    } catch (error) {
      // No audio device or the page has not been interacted with yet: the card itself is the signal.
    }
  }

  notifyBox.checked = prefs.notify;
  soundBox.checked = prefs.sound;
  notifyBox.addEventListener("change", async () => {
    prefs.notify = notifyBox.checked;
    if (prefs.notify && "Notification" in window && Notification.permission === "default") {
      prefs.notify = (await Notification.requestPermission()) === "granted";
    }
    if (prefs.notify && (!("Notification" in window) || Notification.permission !== "granted")) prefs.notify = false;
    notifyBox.checked = prefs.notify;
    localStorage.setItem("aleph.approvals.notify", prefs.notify ? "1" : "0");
  });
  soundBox.addEventListener("change", () => {
    prefs.sound = soundBox.checked;
    localStorage.setItem("aleph.approvals.sound", prefs.sound ? "1" : "0");
  });
  helpButton.addEventListener("click", () => {
    help.hidden = !help.hidden;
    helpButton.setAttribute("aria-expanded", String(!help.hidden));
  });

  // -- keyboard shortcuts ----------------------------------------------------------------------

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape") {
      if (selectedId) closeForms(selectedId);
      return;
    }
    if (event.target.closest("input, textarea, select")) return;
    const open = [...cards.values()].filter((entry) => !entry.resolved).map((entry) => entry.card.id);
    if (!open.length) return;
    // Cards are shown newest first, as they sit in the page.
    const order = [...root.children].map((node) => node.dataset.id).filter((id) => open.includes(id));
    if (!selectedId || !open.includes(selectedId)) selectedId = order[0];
    const index = order.indexOf(selectedId);
    const actions = { a: "once", s: "session", y: "always", u: "until", d: "deny" };
    if (event.key === "j" || event.key === "k") {
      const next = order[Math.min(order.length - 1, Math.max(0, index + (event.key === "j" ? 1 : -1)))];
      select(next);
      cards.get(next).el.scrollIntoView({ block: "nearest" });
    } else if (actions[event.key]) {
      event.preventDefault();
      act(selectedId, actions[event.key]);
    } else {
      return;
    }
    refresh();
  });

  // -- the socket ------------------------------------------------------------------------------

  function setConnection(text, kind) {
    connection.textContent = text;
    connection.className = `badge ${kind}`;
  }

  function onMessage(event) {
    const message = JSON.parse(event.data);
    if (message.type === "approval.snapshot") {
      clockOffset = Date.parse(message.now) - Date.now();
      const current = new Set(message.requests.map((card) => card.id));
      for (const [id, entry] of cards) {
        if (!entry.resolved && !current.has(id)) {
          entry.el.remove();
          cards.delete(id);
        }
      }
      message.requests.slice().reverse().forEach((card) => addCard(card, false));
      refresh();
    } else if (message.type === "approval.requested") {
      addCard(message.request, true);
    } else if (message.type === "approval.resolved" || message.type === "approval.expired") {
      resolveCard(message.resolution);
    } else if (message.type === "decide.ok" || message.type === "decide.error") {
      decided(message);
    }
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}${root.dataset.ws}`);
    setConnection("connecting…", "warn");
    socket.onopen = () => {
      retries = 0;
      setConnection("live", "ok");
    };
    socket.onmessage = onMessage;
    socket.onclose = () => {
      const wait = Math.min(30, 2 ** retries);
      retries += 1;
      setConnection(`disconnected — retrying in ${wait} s`, "bad");
      setTimeout(connect, wait * 1000);
    };
  }

  refresh();
  connect();
})();
