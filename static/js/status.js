// The status page: polls /api/status once a second and draws its history on plain canvases.
// No library, no build step.  The page's cookie (given when it was opened with ?token=) lets the fetch in.

const POLL_MS = 1000;
const WINDOW_S = 300; // the history the server keeps: five minutes

const $ = (id) => document.getElementById(id);

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function niceMax(value) {
  // The y axis' top: 1, 2 or 5 times a power of ten, above every value.
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((top) => top >= value);
}

// Draws `series` ([{values, color}]) against `t` (seconds before now, negative); returns the points drawn.
function plot(canvas, t, series, { unit = "", floor = 0 } = {}) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  const left = 56, right = 28, top = 10, bottom = 22;
  const w = width - left - right, h = height - top - bottom;
  ctx.clearRect(0, 0, width, height);
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && Number.isFinite(v));
  const ymax = niceMax(Math.max(floor, ...all));
  const x = (seconds) => left + w * (1 + seconds / WINDOW_S);
  const y = (value) => top + h * (1 - value / ymax);

  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = css("--muted");
  ctx.strokeStyle = css("--border");
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) { // horizontal grid, labelled
    const value = (ymax * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, y(value)); ctx.lineTo(left + w, y(value)); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(`${+value.toPrecision(3)}${unit}`, left - 6, y(value));
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (let s = -WINDOW_S; s <= 0; s += 60) ctx.fillText(s === 0 ? "now" : `${s / 60} min`, x(s), top + h + 5);

  let drawn = 0;
  for (const { values, color } of series) {
    ctx.strokeStyle = color; ctx.fillStyle = color; ctx.lineWidth = 2;
    ctx.beginPath();
    let open = false;
    values.forEach((value, i) => {
      if (value === null || !Number.isFinite(value)) { open = false; return; } // a second without a tick: a gap
      const px = x(t[i]), py = y(value);
      if (open) ctx.lineTo(px, py); else ctx.moveTo(px, py);
      open = true;
      drawn++;
    });
    ctx.stroke();
    const last = values.length - 1; // the newest point as a dot, so that a single one shows
    if (last >= 0 && values[last] !== null) {
      ctx.beginPath(); ctx.arc(x(t[last]), y(values[last]), 2.5, 0, 2 * Math.PI); ctx.fill();
    }
  }
  canvas.dataset.drawn = String(drawn);
  return drawn;
}

const fixed = (value, digits) => (value === undefined || value === null ? "–" : Number(value).toFixed(digits));

function age(seconds) {
  const s = Math.floor(seconds);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
}

function conversationsTable(sessions) {
  const body = $("conversations").tBodies[0];
  const rows = sessions.map((session) => {
    const q = session.quality || {};
    const cells = [
      session.id, session.protocol, session.state, session.persona ?? "–", session.voice ?? "–", age(session.age_s),
      fixed(q.response_latency_ms, 0), fixed(q.talk_over_s, 1), fixed(q.dead_air_s, 1),
      q.agent_share === undefined ? "–" : `${Math.round(100 * q.agent_share)} %`, fixed(q.barge_ins, 0),
    ];
    const words = session.words || {};
    const tr = document.createElement("tr");
    tr.dataset.session = String(session.id);
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = String(text); // (a persona is the client's text: never markup)
      if (i === 3) { td.className = "persona"; td.title = session.persona ?? ""; }
      tr.append(td);
    });
    const said = document.createElement("td"); // each side's latest words, marked (the callers' text: never markup)
    said.className = "words";
    for (const [side, text] of [["caller", words.caller], ["agent", words.agent]]) {
      if (!text) continue;
      const line = document.createElement("div");
      line.dataset.speaker = side;
      const mark = document.createElement("b");
      mark.textContent = `${side}: `;
      line.append(mark, text);
      said.append(line);
    }
    if (!said.childElementCount) said.textContent = "–";
    tr.append(said);
    return tr;
  });
  if (!rows.length) {
    const tr = document.createElement("tr");
    tr.className = "empty";
    tr.innerHTML = '<td colspan="12">No conversation.</td>';
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

const GIB = 1024 ** 3;

function show(status) {
  $("model").textContent = `${status.model} · ${status.slots_total} slot(s) · ${status.ticks} ticks`;
  for (const [state, count] of Object.entries(status.slots)) {
    const cell = $(`slots-${state}`);
    if (cell) cell.textContent = count;
  }
  $("queued").textContent = `${status.queued} / ${status.queue_size}`;
  const gpu = status.gpu_memory;
  $("gpu").hidden = !gpu;
  if (gpu) {
    $("gpu-memory").textContent = `${(gpu.allocated / GIB).toFixed(1)} GiB`;
    $("gpu-memory").title = `allocated ${(gpu.allocated / GIB).toFixed(2)} GiB, reserved ${(gpu.reserved / GIB).toFixed(2)} ` +
      `GiB; the device: ${((gpu.total - gpu.free) / GIB).toFixed(1)} of ${(gpu.total / GIB).toFixed(1)} GiB in use`;
  }
  const h = status.history;
  const p50 = css("--accent"), p99 = css("--warn");
  plot($("plot-lateness"), h.t, [{ values: h.lateness_p50_ms, color: p50 }, { values: h.lateness_p99_ms, color: p99 }],
    { unit: " ms", floor: 1 });
  plot($("plot-engine"), h.t, [{ values: h.engine_p50_ms, color: p50 }, { values: h.engine_p99_ms, color: p99 }],
    { unit: " ms", floor: 1 });
  plot($("plot-live"), h.t, [{ values: h.live, color: p50 }, { values: h.ticks, color: p99 }], { floor: 1 });
  conversationsTable(status.sessions);
}

async function poll() {
  const updated = $("updated");
  try {
    const response = await fetch("api/status", { cache: "no-store" });
    if (!response.ok) throw new Error(response.status === 401 ? "the token is needed: open /status?token=…" : `HTTP ${response.status}`);
    show(await response.json());
    updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    updated.classList.remove("stale");
  } catch (error) {
    updated.textContent = `Not updated: ${error.message}`;
    updated.classList.add("stale");
  }
  setTimeout(poll, POLL_MS);
}

poll();
