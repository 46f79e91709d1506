"""Report writers: CSV, JSON, Markdown, LaTeX and box plots, written atomically.

Files in the report folder:

- ``per_case.csv``: ``method, case, region, metric, value``, the group columns, the policies and a
  ``note`` for scores set by a policy (both sides empty, missing prediction);
- ``summary.csv`` / ``summary.json``: the statistics (``summary.json`` adds settings and case
  bookkeeping);
- ``table.md`` / ``table.tex``: paper-style tables (group, method, region rows; statistics
  columns), best value per group and region in bold when several methods are compared;
  ``table.md`` (and the terminal) add, with two or more methods, the paired comparison with the
  first method: differences of the mean and of p10 (with bootstrap intervals), pairs, p-values;
- ``boxplots_<metric>.png``: one panel per region, boxes per group and method;
- ``comparison.csv`` (two or more methods): paired differences, Wilcoxon and Holm p-values.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.atomic import atomic_path, can_replace_folder, check_output_folder, replaced_folder
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.groups import ALL
from nnunet_dro.evaluation.result import EvaluationResult
from nnunet_dro.evaluation.stats import percentile_column

METRIC_TITLES = {"dice": "Dice (%)", "vs": "Volume similarity (%)", "hd95": "HD95 (mm)"}
LOWER_IS_BETTER_METRICS = {"hd95"}
SPREAD_COLUMNS = {"std", "iqr"}  # lower is better whatever the metric
OUR_FILES = ("per_case.csv", "summary.csv", "summary.json", "table.md", "table.tex", "comparison.csv", "runs.csv",
             "runs.json")


def is_report_file(name: str) -> bool:
    """Whether a report of this module writes (or, from an earlier run, may have written) ``name``."""
    return name in OUR_FILES or (name.startswith("boxplots_") and name.endswith(".png"))


def check_report_folder(output: str | os.PathLike, option: str = "-o") -> Path:
    """Check that a report can be written to ``output``, before any work starts.

    One-line UserError if ``output`` is a file, lies below a file, is not writable, or is an
    existing folder that holds a folder named like a report file (the report would have to
    delete it).
    """
    output = check_output_folder(output, option)
    if output.is_dir():
        for entry in sorted(output.iterdir()):
            if is_report_file(entry.name) and entry.is_dir():
                raise UserError(f"{option} {output}: {entry} is a folder, but the report writes a file of "
                                f"that name; rename or remove it")
    return output


def write_report(output: str | os.PathLike, result: EvaluationResult) -> None:
    """Write every report file into ``output``; a failure leaves ``output`` exactly as it was.

    A new folder is built beside ``output`` and renamed into place. An existing folder is
    rebuilt beside itself: the new report files, plus the other files it holds (carried over
    as hard links), then swapped in with one atomic rename; report files of an earlier run that
    this run does not produce (a ``comparison.csv``, a box plot) are gone. Where the folder
    cannot be swapped (its parent is not writable, or it is the current directory), the report
    is built in a hidden folder inside it and each file renamed into place.
    """
    output = check_report_folder(output)
    existed = output.exists()
    try:
        if not existed:
            with atomic_path(output) as tmp:
                tmp.mkdir()
                _write_all(tmp, result)
        elif can_replace_folder(output):
            with replaced_folder(output, keep=lambda name: not is_report_file(name)
                                 and not name.startswith(_IN_PLACE_PREFIX)) as tmp:
                _write_all(tmp, result)
        else:
            _write_in_place(output, result)
    except OSError as e:  # a full disk, a quota, a file size limit: the old report is still there
        reason = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
        raise UserError(f"-o {output}: cannot write the report ({reason}); "
                        f"{'the previous report is unchanged' if existed else 'nothing was written'}") from None


def _write_in_place(output: Path, result: EvaluationResult) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=_IN_PLACE_PREFIX, dir=output))
    try:
        _write_all(tmp, result)
        produced = {p.name for p in tmp.iterdir()}
        for old in list(output.glob("boxplots_*.png")) + [output / name for name in OUR_FILES]:
            if old.is_file() and old.name not in produced:
                old.unlink()
        for name in sorted(produced):
            os.replace(tmp / name, output / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_IN_PLACE_PREFIX = ".nnunet_dro_evaluate."


def _write_all(folder: Path, result: EvaluationResult) -> None:
    result.per_case.to_csv(folder / "per_case.csv", index=False)
    result.summary.to_csv(folder / "summary.csv", index=False)
    if result.comparison is not None:
        result.comparison.to_csv(folder / "comparison.csv", index=False)
    if result.runs is not None:  # several runs per method: runs.csv, runs.json (evaluation/runs.py)
        result.runs.write(folder)
    (folder / "summary.json").write_text(summary_json(result), encoding="utf-8")
    (folder / "table.md").write_text(markdown_tables(result), encoding="utf-8")
    (folder / "table.tex").write_text(latex_tables(result), encoding="utf-8")
    for metric in result.settings["metrics"]:
        write_boxplots(folder / f"boxplots_{metric}.png", result, metric)


def _records(frame: pd.DataFrame | None) -> list[dict] | None:
    if frame is None:
        return None
    # NaN is not JSON: write null (statistics of groups without values, p-values without pairs)
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def summary_json(result: EvaluationResult) -> str:
    content = {"settings": result.settings, "cases": result.cases, "summary": _records(result.summary),
               "comparison": _records(result.comparison)}
    return json.dumps(content, indent=2, allow_nan=False, default=_json_default) + "\n"


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    raise TypeError(type(value))


def policy_line(result: EvaluationResult) -> str:
    s = result.settings
    return f"Empty masks: {s['empty_policy_text']}. Missing predictions: {s['missing_policy_text']}."


def cross_validation_lines(result: EvaluationResult) -> list[str]:
    """One line per cross-validation method: which folds were read, how many cases."""
    return [f"Cross-validation: {entry['text']}." for entry in (result.settings.get("cross_validation") or {}).values()]


def _stat_columns(result: EvaluationResult) -> list[str]:
    return ["n", "mean", "std", "median", "iqr"] + [percentile_column(q) for q in result.settings["percentiles"]]


def _format(value, metric: str, column: str) -> str:
    if column == "n":
        return str(int(value))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.2f}" if metric == "hd95" else f"{value:.1f}"


def _table_blocks(result: EvaluationResult):
    """(metric, group_column, rows) with rows = [(group, method, region, {column: (text, bold)})]."""
    columns = _stat_columns(result)
    several_methods = result.summary["method"].nunique() > 1
    for metric in result.settings["metrics"]:
        for group_column, block in result.summary[result.summary["metric"] == metric].groupby(
                "group_column", sort=False):
            texts = {idx: {c: _format(row[c], metric, c) for c in columns} for idx, row in block.iterrows()}
            bold = {idx: set() for idx in block.index}
            if several_methods:
                for _, comparison in block.groupby(["group", "region"], sort=False):
                    for c in columns[1:]:
                        shown = {idx: texts[idx][c] for idx in comparison.index if texts[idx][c] != "n/a"}
                        if len(shown) < 2:
                            continue
                        lower = c in SPREAD_COLUMNS or metric in LOWER_IS_BETTER_METRICS
                        numbers = {idx: float(t) for idx, t in shown.items()}
                        best = min(numbers.values()) if lower else max(numbers.values())
                        bold_here = [idx for idx, v in numbers.items() if v == best]
                        if len(bold_here) < len(numbers):  # all equal: nothing stands out
                            for idx in bold_here:
                                bold[idx].add(c)
            rows = [(row["group"], row["method"], row["region"], {c: (texts[idx][c], c in bold[idx]) for c in columns})
                    for idx, row in block.iterrows()]
            yield metric, group_column, rows


def _title(metric: str, group_column: str) -> str:
    return f"{METRIC_TITLES[metric]}, {'all cases' if group_column == ALL else 'by ' + group_column}"


def comparison_percentile(percentiles) -> float | None:
    """The percentile shown in the comparison tables: p10 if requested, else the lowest one.

    >>> comparison_percentile([25, 10, 5]), comparison_percentile([25, 5]), comparison_percentile([])
    (10, 5, None)
    """
    if not percentiles:
        return None
    return 10 if 10 in percentiles else min(percentiles)


def _decimals(metric: str) -> int:
    return 2 if metric == "hd95" else 1


def _signed(value, metric: str) -> str:
    """``+1.2`` / ``-0.4`` / ``+0.0`` (never ``-0.0``); ``n/a`` for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    d = _decimals(metric)
    return f"{round(float(value), d) + 0.0:+.{d}f}"


def _difference_cell(row, column: str, metric: str) -> str:
    text = _signed(row[column], metric)
    low, high = row.get(f"{column}_ci_low"), row.get(f"{column}_ci_high")
    if text != "n/a" and low is not None and not (isinstance(low, float) and math.isnan(low)):
        text += f" [{_signed(low, metric)}, {_signed(high, metric)}]"
    return text


def _p_text(p, note: str = "") -> str:
    if note:
        return note
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def comparison_markdown(result: EvaluationResult, metrics: list[str] | None = None) -> list[str]:
    """Markdown lines of the paired comparison with the first method, one table per metric and
    group column: pairs, the difference of the mean and of p10 (with ``[low, high]`` bootstrap 95 %
    intervals when ``--bootstrap`` was given), the Wilcoxon and Holm p-values (or why there is none)."""
    comparison = result.comparison
    if comparison is None or comparison.empty:
        return []
    q = comparison_percentile(result.settings["percentiles"])
    columns = [("mean_difference", "Δ mean")]
    if q is not None:
        columns.append((f"{percentile_column(q)}_difference", f"Δ {percentile_column(q)}"))
    base = comparison["reference_method"].iloc[0]
    intervals = "; [95 % bootstrap interval]" if result.settings.get("n_bootstrap") else ""
    lines = []
    for metric in result.settings["metrics"]:
        if metrics is not None and metric not in metrics:
            continue
        for group_column, block in comparison[comparison["metric"] == metric].groupby("group_column", sort=False):
            lines += [f"## {_title(metric, group_column)}: paired difference to {base}", "",
                      f"Method minus {base} on the cases both scored{intervals}; "
                      f"Wilcoxon signed-rank p (two-sided), Holm-adjusted over all comparisons of the metric.", "",
                      "| group | method | region | pairs | " + " | ".join(t for _, t in columns)
                      + " | Wilcoxon p | Holm p |",
                      "|---|---|---|---:|" + "---:|" * len(columns) + "---:|---:|"]
            for _, row in block.iterrows():
                note = row.get("wilcoxon_note") or ""
                note = "" if isinstance(note, float) else note
                cells = [_difference_cell(row, c, metric) for c, _ in columns]
                holm_text = "–" if note else _p_text(row["holm_p"])
                lines.append(f"| {row['group']} | {row['method']} | {row['region']} | {int(row['n_pairs'])} | "
                             + " | ".join(cells) + f" | {_p_text(row['wilcoxon_p'], note)}"
                             + f" | {holm_text} |")
            lines.append("")
    return lines


def markdown_tables(result: EvaluationResult, metrics: list[str] | None = None) -> str:
    """Paper-style Markdown tables, one per metric and group column, then (two or more methods)
    the paired comparison with the first method (:func:`comparison_markdown`)."""
    columns = _stat_columns(result)
    lines = ["# Robustness evaluation (nnunet_dro evaluate)", "",
             policy_line(result) + " Percentiles: numpy linear interpolation; iqr = p75 - p25; "
                                   "best value per group and region in bold.", ""]
    cross_validation = cross_validation_lines(result)
    if cross_validation:
        lines += cross_validation + [""]
    for metric, group_column, rows in _table_blocks(result):
        if metrics is not None and metric not in metrics:
            continue
        lines += [f"## {_title(metric, group_column)}", "",
                  "| group | method | region | " + " | ".join(columns) + " |",
                  "|---|---|---|" + "---:|" * len(columns)]
        for group, method, region, cells in rows:
            shown = [f"**{t}**" if b else t for t, b in (cells[c] for c in columns)]
            lines.append(f"| {group} | {method} | {region} | " + " | ".join(shown) + " |")
        lines.append("")
    lines += comparison_markdown(result, metrics)
    if result.runs is not None:
        lines += runs_markdown(result, metrics)
    return "\n".join(lines)


def runs_markdown(result: EvaluationResult, metrics: list[str] | None = None) -> list[str]:
    """The section 'Several trainings per method' (statistics over runs, :mod:`~.runs`)."""
    from nnunet_dro.evaluation.runs import markdown_section

    table = result.runs.table
    if metrics is not None:
        table = table[table["metric"].isin(metrics)]
    return markdown_section(table, METRIC_TITLES, result.runs.settings["paired"], result.runs.settings["n_bootstrap"],
                            {m: _decimals(m) for m in result.settings["metrics"]})


def terminal_table(result: EvaluationResult) -> str:
    """The main table for the terminal: the first metric, every grouping, and its paired
    comparison with the first method."""
    return markdown_tables(result, metrics=[result.settings["metrics"][0]]).rstrip() + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "[": "{[}", "]": "{]}"}


def latex_escape(text: str) -> str:
    """Escape text for a LaTeX table cell (``[`` is braced: after ``\\\\`` it would start an option).

    >>> latex_escape("[19,25) spina_bifida")
    '{[}19,25) spina\\\\_bifida'
    """
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_tables(result: EvaluationResult) -> str:
    """Paper-style LaTeX tables (booktabs), one per metric and group column."""
    columns = _stat_columns(result)
    out = ["% nnunet_dro evaluate: needs \\usepackage{booktabs}",
           "% " + policy_line(result)] + ["% " + line for line in cross_validation_lines(result)] + [""]
    for metric, group_column, rows in _table_blocks(result):
        out += ["\\begin{table}[ht]", "\\centering",
                f"\\caption{{{latex_escape(_title(metric, group_column))}. {latex_escape(policy_line(result))}}}",
                "\\begin{tabular}{lll" + "r" * len(columns) + "}", "\\toprule",
                "Group & Method & Region & " + " & ".join(latex_escape(c) for c in columns) + " \\\\", "\\midrule"]
        previous_group = None
        for group, method, region, cells in rows:
            if previous_group is not None and group != previous_group:
                out.append("\\midrule")
            previous_group = group
            shown = [f"\\textbf{{{t}}}" if b else t for t, b in (cells[c] for c in columns)]
            out.append(" & ".join([latex_escape(group), latex_escape(method), latex_escape(region)] + shown) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out)


def write_boxplots(path: Path, result: EvaluationResult, metric: str) -> None:
    """One panel per region; along x the groups ('all' first), one box per method in each group."""
    # The object-oriented API with the Agg canvas: no pyplot, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    per_case = result.per_case[result.per_case["metric"] == metric]
    methods = list(result.settings["predictions"])
    groupings = [(ALL, ALL)] + [(c, g) for c in result.group_columns
                                for g in result.summary.loc[result.summary["group_column"] == c, "group"].unique()]
    regions = [r.name for r in result.regions]
    width = max(4.0, 0.5 + 0.45 * len(groupings) * max(len(methods), 1))
    rows = math.ceil(len(regions) / 3)
    # Fixed margins instead of layout="constrained": the constrained solver took most of the run time.
    figure = Figure(figsize=(width * min(len(regions), 3), 3.8 * rows))
    figure.subplots_adjust(left=0.06 if len(regions) > 1 else 0.15, right=0.98, top=1 - 0.5 / (3.8 * rows),
                           bottom=0.85 / (3.8 * rows), wspace=0.25, hspace=0.55)
    FigureCanvasAgg(figure)
    ncols = min(len(regions), 3)
    colours = [f"C{i}" for i in range(len(methods))]
    box_width = 0.8 / max(len(methods), 1)
    for k, region in enumerate(regions):
        axis = figure.add_subplot(rows, ncols, k + 1)
        data = per_case[per_case["region"] == region]
        for i, method in enumerate(methods):
            values, positions = [], []
            for x, (column, group) in enumerate(groupings):
                selected = data[data["method"] == method]
                if column != ALL:
                    selected = selected[selected[column] == group]
                v = selected["value"].to_numpy(float)
                v = v[~np.isnan(v)]
                if v.size:
                    values.append(v)
                    positions.append(x - 0.4 + box_width * (i + 0.5))
            if values:
                boxes = axis.boxplot(values, positions=positions, widths=box_width * 0.9, patch_artist=True,
                                     showfliers=True, manage_ticks=False)
                for patch in boxes["boxes"]:
                    patch.set_facecolor(colours[i])
                    patch.set_alpha(0.6)
                for median in boxes["medians"]:
                    median.set_color("black")
        axis.set_xticks(range(len(groupings)))
        axis.set_xticklabels([g if c == ALL else f"{c}={g}" for c, g in groupings], rotation=30, ha="right",
                             fontsize=8)
        axis.set_title(region)
        axis.set_ylabel(METRIC_TITLES[metric])
        axis.grid(axis="y", alpha=0.3)
    if len(methods) > 1:
        from matplotlib.patches import Patch
        figure.legend(handles=[Patch(facecolor=c, alpha=0.6, label=m) for c, m in zip(colours, methods)],
                      loc="upper left", bbox_to_anchor=(0.005, 1.0), fontsize=7, ncols=len(methods), frameon=False)
    figure.suptitle(f"{METRIC_TITLES[metric]} per case (--empty {result.settings['empty_policy']}, "
                    f"--missing {result.settings['missing_policy']})", fontsize=9)
    figure.savefig(path, dpi=100)
