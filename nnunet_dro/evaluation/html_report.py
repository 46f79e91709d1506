"""``report.html``: the whole report in one self-contained file, to attach to an e-mail or a supplement.

It holds the terminal's summary, the tables of ``table.md`` (as HTML tables, bold kept), every
figure of the report folder (box plots, disparity figures, the gallery of worst cases) embedded as
``data:`` URIs, and the settings the numbers depend on (tolerances, empty and missing policies,
which intervals: case-resampling bootstrap or over training runs). No script, no stylesheet or
font from the network: it opens offline, in any browser, years later.

:func:`write_gallery_and_html` is called by the report writer (:mod:`~nnunet_dro.evaluation.reports`)
inside the folder it builds beside the report and renames into place, so ``report.html`` and the
gallery are written atomically with every other report file. It draws the gallery first, then
reads back every PNG of the folder.

>>> print(markdown_to_html("## Dice\\n\\n| a | b |\\n|---|---:|\\n| **1** | <2 |"))
<h3>Dice</h3>
<table>
<thead><tr><th>a</th><th>b</th></tr></thead>
<tbody>
<tr><td><strong>1</strong></td><td>&lt;2</td></tr>
</tbody>
</table>
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from nnunet_dro.evaluation.gallery import LEGEND_TEXT, write_gallery
from nnunet_dro.evaluation.io import DIRECTION_ATOL, SPACING_ORIGIN_ATOL
from nnunet_dro.evaluation.metrics import METRIC_INFO
from nnunet_dro.evaluation.result import EvaluationResult

REPORT_NAME = "report.html"
#: The figures embedded, in this order, with a caption each (prefix -> caption start).
FIGURES = (("boxplots_", "Box plots"), ("disparity_", "Disparity between groups"),
           ("worst_", "Gallery of the worst cases"))
STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 80em; color: #222; }
pre { background: #f4f4f4; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em 0; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.5em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #444; }
dt { font-weight: bold; margin-top: 0.4em; } dd { margin-left: 1.5em; }
"""


def _inline(text: str) -> str:
    """Markdown's inline marks that our tables use (bold, code), on escaped text."""
    text = html.escape(text, quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def markdown_to_html(markdown: str) -> str:
    """The Markdown that :func:`~nnunet_dro.evaluation.reports.markdown_tables` writes (headings,
    pipe tables, paragraphs) as HTML; every text escaped."""
    out: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            rows = [b for b in block if not re.fullmatch(r"\|?[\s:|-]+\|?", b.strip())]
            out.append("<table>")
            out.append("<thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in _cells(rows[0])) + "</tr></thead>")
            out.append("<tbody>")
            out.extend("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(row)) + "</tr>" for row in rows[1:])
            out.append("</tbody>")
            out.append("</table>")
            continue
        heading = re.match(r"(#{1,6})\s+(.*)", line)
        if heading:
            level = min(len(heading.group(1)) + 1, 6)  # h1 is the page's own title
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def interval_text(settings: dict) -> str:
    """Which intervals the report's numbers carry, named as what they resample."""
    runs = settings.get("runs")
    if runs:
        return (f"intervals over runs (runs and test cases resampled): 95 % percentile bootstrap, "
                f"{runs['n_bootstrap']} resamples, {'paired seeds' if runs['paired'] else 'unpaired runs'}; "
                "each run on its own carries no interval")
    n = settings.get("n_bootstrap") or 0
    if n == 0:
        return "none (--bootstrap 0): no intervals; the differences are point estimates with Wilcoxon p-values"
    return (f"case-resampling bootstrap: 95 % percentile intervals, {n} resamples, seed 0 (pairs kept together; "
            "within each group for the disparity statistics); it does not measure run-to-run variance")


def settings_items(result: EvaluationResult) -> list[tuple[str, str]]:
    """(name, value) of every setting the report's numbers depend on."""
    s = result.settings
    metrics = ", ".join(f"{m} ({METRIC_INFO[m].unit}, {s['directions'][m]})" for m in s["metrics"])
    items = [("Reference", s["reference"]),
             ("Methods", "; ".join(f"{name} = {path} ({s['prediction_kinds'][name]})"
                                   for name, path in s["predictions"].items())),
             ("Metrics", metrics),
             ("Regions", "; ".join(f"{name}: labels {', '.join(map(str, labels))}"
                                   for name, labels in s["regions"].items())),
             ("Percentiles", ", ".join(f"p{q:g}" for q in s["percentiles"]) + f" ({s['statistics']['tails']})"),
             ("Empty masks", s["empty_policy_text"]),
             ("Missing predictions", s["missing_policy_text"]),
             ("Intervals", interval_text(s)),
             ("Tolerances", (f"NSD tolerance {s['nsd_tolerance_mm']:g} mm; " if s.get("nsd_tolerance_mm") is not None
                             else "")
              + f"geometry of reference and prediction equal within {SPACING_ORIGIN_ATOL:g} mm (spacing, origin) "
                f"and {DIRECTION_ATOL:g} (direction cosines)")]
    if s.get("group_table"):
        items.append(("Group table", f"{s['group_table']} (case column {s['case_column']!r}; "
                                     f"group columns {', '.join(result.group_columns)})"))
    for entry in (s.get("cross_validation") or {}).values():
        items.append(("Cross-validation", entry["text"]))
    gallery = result.gallery
    if gallery is not None:
        text = f"the {gallery.k} worst cases per group, region and method; images from {gallery.images_folder}; " \
               f"{LEGEND_TEXT}"
    elif s.get("runs"):
        text = "none: several runs per method have no gallery (evaluate one run's folder for its worst cases)"
    else:
        text = "none: no images (give -i IMAGES, or an imagesTs/imagesTr beside the labels), or --gallery 0"
    items.append(("Gallery", text))
    items.append(("Versions", ", ".join(f"{p} {v}" for p, v in s["versions"].items() if v)))
    return items


def _figure(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(f"{caption}: {path.name}")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
            f"<figcaption>{html.escape(caption)} ({html.escape(path.name)})</figcaption></figure>")


def render(folder: Path, result: EvaluationResult, terminal: str, tables_markdown: str) -> str:
    """The page: summary, tables, figures (read from ``folder``), settings."""
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>nnunet_dro evaluate: report</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
             "<h1>nnunet_dro evaluate: report</h1>",
             '<section id="summary"><h2>Summary</h2>', f"<pre>{html.escape(terminal)}</pre></section>",
             '<section id="tables"><h2>Tables</h2>', markdown_to_html(tables_markdown), "</section>",
             '<section id="figures"><h2>Figures</h2>']
    for prefix, caption in FIGURES:
        for metric in result.settings["metrics"]:
            path = folder / f"{prefix}{metric}.png"
            if path.is_file():
                text = f"{caption}, {METRIC_INFO[metric].title}"
                if prefix == "worst_":
                    text += f" ({LEGEND_TEXT})"
                parts.append(_figure(path, text))
    parts.append("</section>")
    parts.append('<section id="settings"><h2>Settings</h2><dl>')
    parts.extend(f"<dt>{html.escape(name)}</dt><dd>{html.escape(value)}</dd>" for name, value in
                 settings_items(result))
    parts.extend(["</dl></section>", "</body>", "</html>", ""])
    return "\n".join(parts)


def write_gallery_and_html(folder: Path, result: EvaluationResult, terminal: str, tables_markdown: str) -> None:
    """Draw ``worst_<metric>.png`` (with images) and then ``report.html`` into ``folder``.

    ``terminal``: what ``nnunet_dro evaluate`` prints; ``tables_markdown``: ``table.md``'s text
    (passed in, so this module does not import the report writer that calls it).
    """
    if result.gallery is not None:
        orders = {c: list(result.summary.loc[result.summary["group_column"] == c, "group"].drop_duplicates())
                  for c in result.group_columns}
        methods = list(dict.fromkeys(result.per_case["method"]))
        cache: dict = {}  # 2D slices only: a case among the worst by several metrics is read once
        for metric in result.settings["metrics"]:
            write_gallery(folder / f"worst_{metric}.png", result.per_case, metric, result.gallery,
                          result.group_columns, orders, methods, cache)
    (folder / REPORT_NAME).write_text(render(folder, result, terminal, tables_markdown), encoding="utf-8")
