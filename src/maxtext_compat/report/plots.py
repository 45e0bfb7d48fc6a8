"""The benchmark figures of build/bench.json as SVG plots (matplotlib): eager overhead per release, decode step
ratios against MaxText's native path, and KV cache bytes paged vs contiguous.

Why matplotlib and inline SVG: the report page and the site embed the figures in the page itself (no file to lose,
nothing fetched), and SVG stays sharp at any zoom. matplotlib is imported only here, when there are rows to plot
(`pip install 'maxtext-compat[docs]'`; the dev and unit environments have it).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import Any

# section prefix of a bench row's figure -> (caption, what the bars show)
SECTIONS: dict[str, tuple[str, str]] = {
    "eager overhead": ("Eager overhead per call (µs), per release and call: adapter and patched class", "value"),
    "paged decode": ("Paged decode step, ratio to MaxText 0.2.5's native path (1.0 = as fast)", "ratio"),
    "memory": ("KV cache bytes for ragged batches: paged vs MaxText's contiguous cache (MiB)", "memory"),
}


def _rows(bench: Mapping[str, Any], prefix: str) -> list[Mapping[str, Any]]:
    return [
        r for r in bench.get("rows", ()) if str(r.get("figure", "")).startswith(prefix) and r.get("value") is not None
    ]


def _label(row: Mapping[str, Any], prefix: str) -> str:
    text = str(row["figure"])[len(prefix) :].lstrip(" ·,")
    return f"{text} [{row.get('env', '?')}]"


def _svg(fig: Any) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = out.getvalue()
    return re.sub(r"^.*?(<svg)", r"\1", text, count=1, flags=re.S)  # drop the XML prolog and DOCTYPE: inline


def bench_figures(bench: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(caption, inline SVG) for each section of `bench` (build/bench.json) that has rows with values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[tuple[str, str]] = []
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "maxtext-compat", "font.size": 9}):
        for prefix, (caption, kind) in SECTIONS.items():
            rows = _rows(bench, prefix)
            if not rows:
                continue
            labels = [_label(r, prefix) for r in rows]
            fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.0))
            ys = list(range(len(rows)))
            if kind == "memory":
                mib = 1 / (1 << 20)
                paged = [float(r["value"]) * mib for r in rows]
                contiguous = [float(r.get("native") or 0) * mib for r in rows]
                ax.barh([y - 0.2 for y in ys], paged, height=0.4, label="paged", color="#43a047")
                ax.barh([y + 0.2 for y in ys], contiguous, height=0.4, label="contiguous", color="#90a4ae")
                ax.legend(loc="lower right")
                ax.set_xlabel("MiB")
            elif kind == "ratio":
                ratios = [float(r.get("ratio") or 0) for r in rows]
                ax.barh(ys, ratios, color="#1565c0")
                ax.axvline(1.0, color="#c62828", linewidth=1)
                ax.set_xlabel("ratio to native (lower is faster)")
            else:
                ax.barh(ys, [float(r["value"]) for r in rows], color="#6a1b9a")
                ax.set_xlabel(str(rows[0].get("unit", "")))
            ax.set_yticks(ys, labels)
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
            figures.append((caption, _svg(fig)))
            plt.close(fig)
    return figures
