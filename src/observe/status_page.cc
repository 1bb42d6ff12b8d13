#include "src/observe/status_page.h"

namespace atl {

// Self-contained: no script or style from elsewhere (runs behind firewalls, offline). It polls
// /api/status every two seconds and draws with inline SVG.
const char* StatusPageHtml() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>atoll run</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em 2em; color: #1d2330; background: #fafbfc; }
  h1 { font-size: 20px; margin: 0 0 .2em; }
  h2 { font-size: 15px; margin: 1.4em 0 .4em; }
  #summary { color: #4a5568; }
  table { border-collapse: collapse; background: #fff; }
  th, td { padding: 4px 10px; border-bottom: 1px solid #e2e8f0; text-align: right; white-space: nowrap; }
  th { background: #edf2f7; font-weight: 600; }
  td.id, th.id { text-align: left; font-weight: 600; }
  .state-active { color: #2f855a; } .state-joining { color: #b7791f; }
  .state-leaving { color: #718096; } .state-dead { color: #c53030; }
  .charts { display: flex; flex-wrap: wrap; gap: 18px; }
  .chart { background: #fff; border: 1px solid #e2e8f0; padding: 6px; }
  .chart .title { font-weight: 600; font-size: 13px; }
  svg text { font-size: 10px; fill: #4a5568; }
  .legend span { margin-right: 10px; font-size: 12px; }
  #error { color: #c53030; }
</style>
</head>
<body>
<h1>atoll run <span id="run"></span></h1>
<div id="summary">loading…</div>
<div id="error"></div>
<h2>Islands</h2>
<table id="islands">
  <thead><tr>
    <th class="id">island</th><th>state</th><th>step</th><th>loss</th><th>val loss</th>
    <th>tokens/s</th><th>utilization</th><th>sent</th><th>received</th><th>in now</th>
    <th>out now</th><th>contributions</th><th>last contribution</th><th>staleness</th><th>silent</th>
  </tr></thead>
  <tbody></tbody>
</table>
<div class="legend" id="legend"></div>
<div class="charts">
  <div class="chart"><div class="title">inner loss (by step)</div><svg id="loss" width="440" height="220"></svg></div>
  <div class="chart"><div class="title">validation loss (by step)</div><svg id="val" width="440" height="220"></svg></div>
  <div class="chart"><div class="title">bandwidth per island, bit/s (pushes in: solid, updates out: dashed)</div><svg id="bw" width="440" height="220"></svg></div>
  <div class="chart"><div class="title">rounds timeline (wall s; one row per fragment, dot size: contributors)</div><svg id="timeline" width="440" height="220"></svg></div>
</div>
<script>
const colors = ['#3182ce', '#dd6b20', '#38a169', '#805ad5', '#d53f8c', '#319795', '#b7791f', '#e53e3e'];
function color(i) { return colors[i % colors.length]; }
function bytes(n) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function bits(n) {
  const u = ['bit/s', 'kbit/s', 'Mbit/s', 'Gbit/s']; let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return n.toFixed(1) + ' ' + u[i];
}
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c])); }
function el(name, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
// Line chart of several series [{points: [[x, y]...], color, dash}] with axes and min/max labels.
function plot(svg, series, fmt) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute('width'), H = +svg.getAttribute('height'), L = 48, B = 18, T = 6, R = 6;
  let xs = [], ys = [];
  for (const s of series) for (const p of s.points) { xs.push(p[0]); ys.push(p[1]); }
  svg.appendChild(el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: 'none', stroke: '#cbd5e0'}));
  if (xs.length === 0) { svg.appendChild(el('text', {x: L + 8, y: T + 16}, 'no data yet')); return; }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 = y0 + 1; }
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  svg.appendChild(el('text', {x: 2, y: T + 10}, fmt(y1)));
  svg.appendChild(el('text', {x: 2, y: H - B}, fmt(y0)));
  svg.appendChild(el('text', {x: L, y: H - 4}, (+x0.toFixed(1)).toString()));
  svg.appendChild(el('text', {x: W - R - 40, y: H - 4}, (+x1.toFixed(1)).toString()));
  for (const s of series) {
    if (s.points.length === 0) continue;
    const d = s.points.map((p, i) => (i ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1)).join(' ');
    svg.appendChild(el('path', {d: d, fill: 'none', stroke: s.color, 'stroke-width': 1.5, 'stroke-dasharray': s.dash || ''}));
    if (s.points.length <= 64 && !s.dash) {  // few points (evaluations): show each
      for (const p of s.points) svg.appendChild(el('circle', {cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2.5, fill: s.color}));
    }
  }
}
function timeline(svg, rounds, fragments, wall) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute('width'), H = +svg.getAttribute('height'), L = 48, B = 18, T = 6, R = 6;
  svg.appendChild(el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: 'none', stroke: '#cbd5e0'}));
  const x1 = Math.max(wall, 1), rows = Math.max(fragments, 1), rowH = (H - T - B) / rows;
  for (let f = 0; f < rows; f++) svg.appendChild(el('text', {x: 2, y: T + rowH * (f + 0.5) + 3}, 'frag ' + f));
  svg.appendChild(el('text', {x: L, y: H - 4}, '0'));
  svg.appendChild(el('text', {x: W - R - 40, y: H - 4}, x1.toFixed(0) + ' s'));
  for (const r of rounds) {
    const cx = L + r.wall_s / x1 * (W - L - R), cy = T + rowH * (r.fragment + 0.5);
    const c = el('circle', {cx: cx.toFixed(1), cy: cy.toFixed(1), r: 2 + Math.min(r.contributors.length, 8), fill: '#3182ce', 'fill-opacity': 0.5});
    c.appendChild(el('title', {}, 'round ' + r.round + ' of fragment ' + r.fragment + ': ' + r.contributors.join('+') +
      ', round ' + r.round_s.toFixed(2) + ' s, commit ' + (1e3 * r.commit_s).toFixed(1) + ' ms'));
    svg.appendChild(c);
  }
}
function render(s) {
  document.getElementById('run').textContent = "'" + s.run_id + "'";
  const progress = s.mode === 'async' ? s.committed_rounds + ' versions applied'
                                      : s.committed_rounds + ' / ' + s.total_rounds + ' rounds committed';
  document.getElementById('summary').textContent =
    s.mode + ' DiLoCo, ' + s.islands_expected + ' islands, H = ' + s.sync_every + ', ' + s.fragments +
    ' fragment(s), ' + s.total_steps + ' inner steps: ' + progress + '; membership epoch ' +
    s.membership_epoch + ', ' + s.lease_expiries + ' lease expiries; ' + s.wall_s.toFixed(0) + ' s';
  const body = document.querySelector('#islands tbody');
  body.innerHTML = '';
  const legend = document.getElementById('legend');
  legend.innerHTML = '';
  s.islands.forEach((i, k) => {
    const last = i.last_contribution ? 'round ' + i.last_contribution.round + ' (frag ' +
      i.last_contribution.fragment + ') at ' + i.last_contribution.wall_s.toFixed(0) + ' s' : '-';
    const tr = document.createElement('tr');
    tr.id = 'island-' + i.id;
    tr.innerHTML = '<td class="id" style="color:' + color(k) + '">' + esc(i.id) + '</td>' +
      '<td class="state-' + i.state + '">' + i.state + (i.finished ? ' (finished)' : '') + '</td>' +
      '<td>' + i.step + '</td><td>' + (i.loss ? i.loss.toFixed(4) : '-') + '</td>' +
      '<td>' + (i.val_loss ? i.val_loss.toFixed(4) : '-') + '</td>' +
      '<td>' + i.tokens_per_s.toFixed(0) + '</td><td>' + (100 * i.utilization).toFixed(1) + '%</td>' +
      '<td>' + bytes(i.bytes_sent) + '</td><td>' + bytes(i.bytes_received) + '</td>' +
      '<td>' + bits(i.in_bps) + '</td><td>' + bits(i.out_bps) + '</td>' +
      '<td>' + i.contributions + '</td><td>' + last + '</td><td>' + i.staleness + '</td>' +
      '<td>' + (i.member ? i.silent_s.toFixed(1) + ' s' : '-') + '</td>';
    body.appendChild(tr);
    const sp = document.createElement('span');
    sp.style.color = color(k);
    sp.textContent = '■ ' + i.id;
    legend.appendChild(sp);
  });
  const f4 = v => v.toFixed(3);
  plot(document.getElementById('loss'), s.islands.map((i, k) => ({points: i.loss_curve, color: color(k)})), f4);
  plot(document.getElementById('val'), s.islands.map((i, k) => ({points: i.val_loss_curve, color: color(k)})), f4);
  const bw = [];
  s.islands.forEach((i, k) => {
    bw.push({points: i.bandwidth_in, color: color(k)});
    bw.push({points: i.bandwidth_out, color: color(k), dash: '4 3'});
  });
  plot(document.getElementById('bw'), bw, bits);
  timeline(document.getElementById('timeline'), s.timeline, s.fragments, s.wall_s);
  document.body.dataset.islands = s.islands.length;
}
async function refresh() {
  try {
    const r = await fetch('/api/status', {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    render(await r.json());
    document.getElementById('error').textContent = '';
  } catch (e) {
    document.getElementById('error').textContent = 'status not reachable: ' + e.message + ' (the run may have ended)';
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";
}

}  // namespace atl
