// Refreshes the dashboard's body in place every few seconds (no page reload).
"use strict";
(function () {
  const root = document.getElementById("conveyor-overview");
  if (!root) return;
  const status = document.getElementById("conveyor-refresh-status");
  const url = root.dataset.refreshUrl;
  const seconds = Number(root.dataset.refreshSeconds) || 5;
  let busy = false;

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(url, {
        credentials: "same-origin",
        headers: {"X-Requested-With": "XMLHttpRequest"},
      });
      if (!response.ok) throw new Error("HTTP " + response.status);
      root.innerHTML = await response.text();
      root.dataset.refreshes = String(Number(root.dataset.refreshes || 0) + 1);
      if (status) status.textContent = "Last updated " + new Date().toLocaleTimeString() + ".";
    } catch (error) {
      if (status) status.textContent = "Could not update (" + error.message + "); retrying.";
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
