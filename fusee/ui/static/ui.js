// Fusee web UI: live regions, confirmation dialogs and stream followers. No build step.
"use strict";

// An element with data-live="url" is refreshed from that URL every data-every ms, replaced
// only when the server's version of it changed (open <details> stay open).
function follow(el) {
  const every = parseInt(el.dataset.every || "3000", 10);
  async function tick() {
    try {
      const r = await fetch(el.dataset.live, { headers: { "X-Fusee-Fragment": "1" }, cache: "no-store" });
      const version = r.headers.get("X-Fusee-Version");
      if (r.ok && version !== el.dataset.version) {
        const html = await r.text();
        const open = Array.from(el.querySelectorAll("details")).map((d) => d.open);
        el.innerHTML = html;
        el.querySelectorAll("details").forEach((d, i) => { if (open[i]) d.open = true; });
        el.dataset.version = version;
      }
    } catch (e) { /* the server is away: try again at the next tick */ }
    setTimeout(tick, document.hidden ? every * 4 : every);
  }
  setTimeout(tick, every);
}

// <pre data-stream="url">: a stream's chunks, followed with Server-Sent Events until it ends.
function stream(pre) {
  const source = new EventSource(pre.dataset.stream);
  source.onmessage = (ev) => {
    let v = JSON.parse(ev.data);
    if (typeof v !== "string") v = JSON.stringify(v);
    pre.textContent += v + (v.endsWith("\n") ? "" : "\n");
    pre.scrollTop = pre.scrollHeight;
  };
  source.addEventListener("end", () => { source.close(); pre.classList.add("ended"); });
  source.addEventListener("failure", (ev) => { source.close(); pre.textContent += "\n[" + JSON.parse(ev.data) + "]"; });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(follow);
  document.querySelectorAll("pre[data-stream]").forEach(stream);
  // A form refused with what was typed kept: its dialog opens again.
  document.querySelectorAll("dialog[data-open]").forEach((d) => d.showModal());
  // Delegated: the buttons live in regions that refresh.
  document.addEventListener("click", (ev) => {
    const open = ev.target.closest("[data-dialog]");
    if (open) document.getElementById(open.dataset.dialog).showModal();
    const close = ev.target.closest("dialog [data-close]");
    if (close) close.closest("dialog").close();
  });
  // Filters apply as soon as a select changes.
  const status = document.getElementById("status-filter");
  if (status) status.addEventListener("change", () => status.form.submit());
});
