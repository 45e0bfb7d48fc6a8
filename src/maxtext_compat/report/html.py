"""The compat report page: one self-contained HTML file (inline style, script and figures; nothing fetched).

Why self-contained: it is opened from disk (build/compat-report.html), attached to a CI run, or embedded in the
documentation site, and must look the same in each. Hover a chip for its environment, test counts and time; click
it (or open the page with `#env=NAME`) for the whole result in the details panel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from maxtext_compat.report.grid import KERNEL_ONLY, NO_TPU_INFERENCE, STATES, Grid

COLOURS: dict[str, tuple[str, str]] = {  # state: (background, text)
    "failed": ("#c62828", "#ffffff"),
    "real-serve": ("#1b5e20", "#ffffff"),
    "real-kernel": ("#43a047", "#ffffff"),
    "real-install": ("#a5d6a7", "#1b1b1b"),
    "not-run": ("#bdbdbd", "#1b1b1b"),
    "mocked": ("#fff176", "#1b1b1b"),
    "allowed": ("#eceff1", "#37474f"),
    "refused": ("#ffcdd2", "#7f0000"),
    "none": ("#ffffff", "#9e9e9e"),
}
SHORT = {
    "failed": "failed",
    "real-serve": "real serve",
    "real-kernel": "real kernel",
    "real-install": "real install",
    "not-run": "not run",
    "mocked": "mocked",
    "allowed": "allowed",
    "refused": "refused",
    "none": "",
}

STYLE = """
#mc-report { font: 14px/1.4 system-ui, sans-serif; color: #1b1b1b; }
#mc-report table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
#mc-report th, #mc-report td { border: 1px solid #cfd8dc; padding: 4px 6px; vertical-align: top; }
#mc-grid th.col { font-weight: 600; font-size: 12px; white-space: nowrap; }
#mc-grid th.col small, #mc-grid th.row small { display: block; font-weight: 400; color: #546e7a; }
#mc-grid td.cell { min-width: 4em; text-align: center; font-size: 12px; cursor: default; }
#mc-grid th.col small { max-width: 7em; white-space: normal; }
#mc-grid td.cell .state { display: block; font-weight: 600; }
#mc-grid button.env { display: block; width: 100%; margin: 2px 0; padding: 1px 4px; font: inherit;
  border: 1px solid rgba(0,0,0,.35); border-radius: 3px; background: rgba(255,255,255,.85); color: #1b1b1b;
  cursor: pointer; }
#mc-grid button.env.selected { outline: 3px solid #1565c0; }
#mc-legend span { display: inline-block; margin: 2px 8px 2px 0; padding: 1px 6px; border-radius: 3px; }
#mc-details { border: 1px solid #90a4ae; padding: 8px 12px; background: #fafafa; min-height: 3em; }
#mc-details dt { font-weight: 600; float: left; clear: left; width: 9em; }
#mc-details dd { margin-left: 9.5em; }
#mc-report .banner { background: #fff8e1; border: 1px solid #ffb300; padding: 6px 10px; }
#mc-report figure { margin: 1em 0; }
#mc-report figure svg { max-width: 100%; height: auto; }
""" + "".join(f"#mc-report .s-{state} {{ background: {bg}; color: {fg}; }}\n" for state, (bg, fg) in COLOURS.items())

SCRIPT = """
(function () {
  var root = document.getElementById("mc-report");
  var data = JSON.parse(document.getElementById("mc-report-data").textContent);
  var panel = document.getElementById("mc-details");
  function row(dl, key, value) {
    var dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = key; dd.textContent = value; dl.appendChild(dt); dl.appendChild(dd);
  }
  function show(name) {
    var env = data.envs[name];
    if (!env) { return; }
    panel.textContent = "";
    var h = document.createElement("h3"); h.textContent = name; panel.appendChild(h);
    var dl = document.createElement("dl"); dl.id = "mc-details-list"; panel.appendChild(dl);
    row(dl, "proven", data.states[env.state]);
    row(dl, "jax", env.jax || "-");
    row(dl, "tpu-inference", env.tpu_inference || "none");
    var r = env.result;
    if (r) {
      row(dl, "status", r.status);
      row(dl, "tests", (r.passed || 0) + " passed, " + ((r.failed || 0) + (r.errors || 0)) + " failed, " +
          (r.skipped || 0) + " skipped");
      row(dl, "duration", Math.round(r.duration_s || 0) + " s");
      if (r.peak_memory_gb) { row(dl, "peak memory", r.peak_memory_gb + " GB"); }
      var p = r.proofs || {};
      row(dl, "real serve tests", String(p.serve || 0));
      row(dl, "real kernel tests", String(p.kernel || 0));
      var w = r.real_weights || {};
      var fams = Object.keys(w).sort();
      var proven = fams.map(function (f) { return f + " (" + w[f] + ")"; });
      row(dl, "real weights", proven.length ? proven.join(", ") : "none");
      var v = r.versions || {};
      var names = Object.keys(v).sort();
      if (names.length) { row(dl, "installed", names.map(function (k) { return k + " " + v[k]; }).join(", ")); }
      if (r.detail) { row(dl, "detail", r.detail); }
    } else {
      row(dl, "status", "no result in this report");
    }
    var buttons = root.querySelectorAll("button.env");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].classList.toggle("selected", buttons[i].dataset.env === name);
    }
    panel.dataset.env = name;
  }
  function reason(cell) {
    panel.textContent = "";
    var h = document.createElement("h3");
    h.textContent = "MaxText " + cell.dataset.maxtext + " with tpu-inference " + cell.dataset.range;
    var p = document.createElement("p"); p.textContent = cell.title;
    panel.appendChild(h); panel.appendChild(p); panel.dataset.env = "";
  }
  root.addEventListener("click", function (ev) {
    var b = ev.target.closest("button.env");
    if (b) { show(b.dataset.env); return; }
    var c = ev.target.closest("td.cell");
    if (c && !c.querySelector("button.env")) { reason(c); }
  });
  var m = /env=([^&]+)/.exec(window.location.hash);
  if (m) { show(decodeURIComponent(m[1])); }
  root.dataset.ready = "yes";
}());
"""


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def _hover(chip: Mapping[str, Any]) -> str:
    r = chip.get("result")
    if not r:
        return f"{chip['name']}: no result in this report"
    bad = int(r.get("failed", 0)) + int(r.get("errors", 0))
    return (f"{chip['name']}: {r.get('status')}, {r.get('passed', 0)} passed, {bad} failed, "
            f"{r.get('skipped', 0)} skipped, {float(r.get('duration_s', 0.0)):.0f} s")  # fmt: skip


def _summary(data: Mapping[str, Any]) -> str:
    envs = data.get("envs", ())
    if data.get("planned"):
        return (
            '<p class="banner">No test run behind this page: it shows the matrix (what is refused, allowed or '
            f"mocked) and the {len(envs)} environments <code>make test</code> runs, not yet run here. "
            "<code>make test</code> (or <code>maxtext-compat matrix</code>) writes the page with results.</p>"
        )
    passed = sum(int(e.get("passed", 0)) for e in envs)
    failed = sum(int(e.get("failed", 0)) + int(e.get("errors", 0)) for e in envs)
    skipped = sum(int(e.get("skipped", 0)) for e in envs)
    ok = sum(1 for e in envs if e.get("status") == "ok")
    return (
        f'<p id="mc-summary">{len(envs)} environments, {ok} passed whole: {passed} tests passed, {failed} failed, '
        f"{skipped} skipped.</p>"
    )


def _grid(grid: Grid) -> str:
    head = ["<tr><th>MaxText \\ tpu-inference</th>"]
    for col in grid.columns:
        rel = ", ".join(grid.column_releases.get(col, ())) or "no tpu-inference"
        label = "none" if col == NO_TPU_INFERENCE else "<br>".join(escape(part) for part in col.split(","))
        head.append(f'<th class="col" data-range="{_attr(col)}">{label}<small>{escape(rel)}</small></th>')
    lines = ['<table id="mc-grid">', "".join(head) + "</tr>"]
    for row in grid.rows:
        conv = grid.conventions.get(row, "no MaxText")
        title = "kernel only (no MaxText)" if row == KERNEL_ONLY else f"MaxText {row}"
        tds = [f'<th class="row" data-maxtext="{_attr(row)}">{escape(title)}<small>{escape(conv)}</small></th>']
        for col in grid.columns:
            cell = grid.cell(row, col)
            chips = "".join(
                f'<button type="button" class="env s-{c.state}" data-env="{_attr(c.name)}" data-state="{c.state}" '
                f'title="{_attr(_hover(c.as_dict()))}">jax {escape(c.jax or "?")}</button>'
                for c in cell.envs
            )
            title = cell.reason or STATES[cell.state]
            tds.append(
                f'<td class="cell s-{cell.state}" data-maxtext="{_attr(row)}" data-range="{_attr(col)}" '
                f'data-state="{cell.state}" title="{_attr(title)}"><span class="state">{SHORT[cell.state]}</span>'
                f"{chips}</td>"
            )
        lines.append("<tr>" + "".join(tds) + "</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _env_table(data: Mapping[str, Any]) -> str:
    lines = [
        '<table id="mc-envs"><tr><th>environment</th><th>maxtext</th><th>status</th><th>passed</th><th>failed</th>'
        "<th>skipped</th><th>time (s)</th><th>peak (GB)</th></tr>"
    ]
    for e in data.get("envs", ()):
        bad = int(e.get("failed", 0)) + int(e.get("errors", 0))
        lines.append(
            f'<tr data-env="{_attr(e["name"])}"><td>{escape(e["name"])}</td><td>{escape(str(e.get("maxtext") or "-"))}'
            f"</td><td>{escape(str(e.get('status')))}</td><td>{e.get('passed', 0)}</td><td>{bad}</td>"
            f"<td>{e.get('skipped', 0)}</td><td>{float(e.get('duration_s', 0.0)):.0f}</td>"
            f"<td>{float(e.get('peak_memory_gb', 0.0)):.1f}</td></tr>"
        )
    return "\n".join([*lines, "</table>"])


def _mocked(data: Mapping[str, Any]) -> str:
    items = [f"<li>MaxText {escape(r['maxtext'])}: {escape(r['covered_by'])}</li>" for r in data.get("mocked_rows", ())]
    items += [
        f"<li>tpu-inference {escape(r['tpu_inference'])}: {escape(r['covered_by'])}; {escape(r.get('why', ''))}</li>"
        for r in data.get("mocked_tpu_inference_rows", ())
    ]
    if not items:
        return '<p id="mc-mocked">None: every MaxText row and tpu-inference range is installed by an environment.</p>'
    return '<ul id="mc-mocked">' + "".join(items) + "</ul>"


def render(
    grid: Grid, data: Mapping[str, Any], figures: Sequence[tuple[str, str]] = (), *, standalone: bool = True
) -> str:
    """The report as HTML: a whole page, or (standalone=False) a fragment for the documentation site."""
    chips = {c.name: c.as_dict() for cell in grid.cells.values() for c in cell.envs}
    payload = json.dumps({"envs": chips, "states": STATES}).replace("</", "<\\/")
    legend = "".join(f'<span class="s-{s}">{escape(text)}</span>' for s, text in STATES.items() if s != "none")
    figs = "".join(
        f'<figure class="bench">{svg}<figcaption>{escape(cap)}</figcaption></figure>' for cap, svg in figures
    )
    body = f"""<div id="mc-report">
<style>{STYLE}</style>
{_summary(data)}
<p id="mc-legend">{legend}</p>
<p>Rows: MaxText releases and the kernel-only environments; columns: the ranges of tpu-inference's RPA entry point
(newest first); in a cell, one chip per environment, labelled by its jax. Hover for the counts, click for the rest.</p>
{_grid(grid)}
<div id="mc-details" aria-live="polite">Click an environment for its result.</div>
<h2>Environments</h2>
{_env_table(data)}
<h2>Rows covered only by mocks</h2>
{_mocked(data)}
{"<h2>Benchmarks</h2>" + figs if figures else ""}
<script type="application/json" id="mc-report-data">{payload}</script>
<script>{SCRIPT}</script>
</div>"""
    if not standalone:
        return body
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>maxtext-compat: compat report</title>'
        f"</head><body><h1>maxtext-compat: compat report</h1>\n{body}\n</body></html>\n"
    )
