"""The report page's CSS and JavaScript, inlined into every report (no network at view time).

The viewer sets text with ``textContent`` only: trajectories hold model output and tool results,
which must never run as markup.
"""

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 2em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;padding-bottom:.2em}
.muted{color:#777}.plots{display:flex;flex-wrap:wrap;gap:12px}
.plot{background:#fff;border:1px solid #ddd;padding:4px}.plot svg{width:480px;height:auto}
pre.config{max-height:22em;overflow:auto;background:#fff;border:1px solid #ddd;padding:.6em}
.controls{display:flex;gap:1em;align-items:center;margin:.6em 0}
.group{display:grid;grid-auto-flow:column;grid-auto-columns:minmax(320px,1fr);gap:10px;
  overflow-x:auto}
.ep{background:#fff;border:1px solid #ccc;border-radius:4px;padding:6px;font-size:12.5px}
.ep.negative{border-color:#c33;background:#fff6f6}
.ep h3{font-size:13px;margin:0 0 4px}.badge{display:inline-block;padding:0 5px;border-radius:3px;
  margin-right:4px;background:#eee;font-size:11px}.badge.neg{background:#c33;color:#fff}
.badge.fixed{background:#36c;color:#fff}.badge.route{background:#6a3;color:#fff}
.tokens{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;
  font-size:12px;border-top:1px dashed #ccc;margin-top:4px;padding-top:4px}
.trained{background:#d6f5d6}.masked{background:#eee;color:#666}
.prompt{color:#999;max-height:6em;overflow:auto}
.tools{margin:4px 0;padding-left:1.2em}
.tools li{font-family:ui-monospace,monospace;font-size:11.5px}
.legend span{padding:0 4px;margin-right:6px}
"""

JS = r"""
(function () {
  const data = JSON.parse(document.getElementById("rollouts").textContent);
  const steps = Object.keys(data).map(Number).sort((a, b) => a - b);
  const stepSel = document.getElementById("step");
  const groupSel = document.getElementById("group");
  const view = document.getElementById("episodes");
  const count = document.getElementById("episode-count");
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(v) { return typeof v === "number" ? v.toFixed(3) : String(v); }
  function groupsOf(step) {
    const g = new Map();
    for (const row of data[step] || []) {
      const key = row.uid || row.task_id;
      if (!g.has(key)) g.set(key, []);
      g.get(key).push(row);
    }
    return g;
  }
  function card(row) {
    const c = el("div", "ep" + (row.negative ? " negative" : ""));
    c.appendChild(el("h3", null, row.task_id + " (" + row.task_type + ")"));
    const b = el("div");
    if (row.negative) b.appendChild(el("span", "badge neg", "negative"));
    b.appendChild(el("span", "badge" + (row.policy === "actor" ? "" : " fixed"), row.policy));
    if (row.route) b.appendChild(el("span", "badge route", "route " + row.route));
    b.appendChild(el("span", "badge", "reward " + fmt(row.reward)));
    b.appendChild(el("span", "badge", "stop " + row.stop_reason));
    if (row.env_failure) b.appendChild(el("span", "badge neg", "env failure"));
    c.appendChild(b);
    const parts = Object.entries(row.reward_parts || {});
    if (parts.length) {
      c.appendChild(el("div", "muted", parts.map(([k, v]) => k + "=" + fmt(v)).join("  ")));
    }
    if (row.errors && row.errors.length) c.appendChild(el("div", "muted", row.errors.join(" | ")));
    const calls = row.tool_calls || [];
    if (calls.length) {
      const ul = el("ul", "tools");
      for (const t of calls) {
        ul.appendChild(el("li", null, "turn " + t.turn + " " + t.name + " -> " + t.result));
      }
      c.appendChild(ul);
    }
    c.appendChild(el("div", "tokens prompt", row.prompt || ""));
    const tok = el("div", "tokens");
    for (const s of row.spans || []) {
      tok.appendChild(el("span", s.trained ? "trained" : "masked", s.text));
    }
    c.appendChild(tok);
    return c;
  }
  function showGroup() {
    view.replaceChildren();
    const rows = groupsOf(stepSel.value).get(groupSel.value) || [];
    for (const r of rows) view.appendChild(card(r));
    count.textContent = String(rows.length);
    view.dataset.episodes = String(rows.length);
  }
  function showStep() {
    groupSel.replaceChildren();
    for (const [key, rows] of groupsOf(stepSel.value)) {
      const rewards = rows.filter(r => !r.negative).map(r => fmt(r.reward)).join(", ");
      groupSel.appendChild(el("option", null, rows[0].task_id + " [" + rewards + "]")).value = key;
    }
    const total = (data[stepSel.value] || []).length;
    document.getElementById("step-count").textContent = String(total);
    showGroup();
  }
  for (const s of steps) stepSel.appendChild(el("option", null, "step " + s)).value = String(s);
  stepSel.addEventListener("change", showStep);
  groupSel.addEventListener("change", showGroup);
  if (steps.length) showStep();
  document.body.dataset.ready = "1";
})();
"""
