"""Report writers: CSV, JSON, Markdown, LaTeX and box plots, written atomically.

Files in the report folder:

- ``per_case.csv``: ``method, case, region, metric, value``, the group columns, the policies and a
  ``note`` for scores set by a policy (both sides empty, missing prediction);
- ``summary.csv`` / ``summary.json``: the statistics (``summary.json`` adds settings and case
  bookkeeping);
- ``table.md`` / ``table.tex``: paper-style tables (group, method, region rows; statistics
  columns), the best mean, median, tail value and CVaR10 per group and region in bold when
  several methods are compared on the same cases (by the metric's direction; never n, std or
  IQR); ``table.md`` (and the terminal) add, with two or more methods, the paired comparison with
  the first method: differences of the mean, of p10 and of CVaR10 (with bootstrap intervals),
  pairs, p-values; and with a group table the disparity between groups;
- ``boxplots_<metric>.png``: one panel per region, boxes per group and method;
- ``disparity_<metric>.png`` (with a group table): per group column and region, each method's
  group means and CVaR10 (with bootstrap intervals), the gap between the best and worst group drawn;
- ``comparison.csv`` (two or more methods): paired differences, Wilcoxon and Holm p-values;
- ``disparity.csv`` (with a group table): best and worst group, gap, ratio, equity-scaled score
  and the change of the gap against the first method (:mod:`~nnunet_dro.evaluation.disparity`).
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
from nnunet_dro.evaluation.formatting import fmt, interval_text, is_missing, json_default, json_value
from nnunet_dro.evaluation.groups import ALL
from nnunet_dro.evaluation.html_report import write_gallery_and_html
from nnunet_dro.evaluation.metrics import METRIC_INFO
from nnunet_dro.evaluation.result import EvaluationResult
from nnunet_dro.evaluation.stats import CVAR_COLUMN, percentile_column

METRIC_TITLES = {name: info.title for name, info in METRIC_INFO.items()}
#: Columns that can crown a winner: location and tail statistics. Never n, nor std / IQR (a spread
#: of zero is no achievement: an all-zero region would "win").
RANKED_COLUMNS = {"mean", "median", CVAR_COLUMN}
OUR_FILES = ("per_case.csv", "summary.csv", "summary.json", "table.md", "table.tex", "comparison.csv",
             "disparity.csv", "runs.csv", "runs.json", "report.html")
FIGURE_PREFIXES = ("boxplots_", "disparity_", "worst_")


def is_report_file(name: str) -> bool:
    """Whether a report of this module writes (or, from an earlier run, may have written) ``name``."""
    return name in OUR_FILES or (name.startswith(FIGURE_PREFIXES) and name.endswith(".png"))


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
        for old in [f for f in output.glob("*.png") if is_report_file(f.name)] + [output / name for name in OUR_FILES]:
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
    if result.disparity is not None:
        result.disparity.to_csv(folder / "disparity.csv", index=False)
    if result.runs is not None:  # several runs per method: runs.csv, runs.json (evaluation/runs.py)
        result.runs.write(folder)
    (folder / "summary.json").write_text(summary_json(result), encoding="utf-8")
    tables_markdown = markdown_tables(result)
    (folder / "table.md").write_text(tables_markdown, encoding="utf-8")
    (folder / "table.tex").write_text(latex_tables(result), encoding="utf-8")
    for metric in result.settings["metrics"]:
        write_boxplots(folder / f"boxplots_{metric}.png", result, metric)
        if result.disparity is not None:
            write_disparity_figure(folder / f"disparity_{metric}.png", result, metric)
    # last: report.html embeds every figure above and the gallery of worst cases (html_report.py)
    write_gallery_and_html(folder, result, terminal_table(result), tables_markdown)


def _records(frame: pd.DataFrame | None) -> list[dict] | None:
    if frame is None:
        return None
    # NaN is not JSON: write null (statistics of groups without values, p-values without pairs)
    return [{k: json_value(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def summary_json(result: EvaluationResult) -> str:
    content = {"settings": result.settings, "cases": result.cases, "summary": _records(result.summary),
               "comparison": _records(result.comparison), "disparity": _records(result.disparity)}
    return json.dumps(content, indent=2, allow_nan=False, default=json_default) + "\n"


def policy_line(result: EvaluationResult) -> str:
    s = result.settings
    # The NSD tolerance decides every NSD value: it goes wherever the policies go (terminal, table.md,
    # table.tex), not only into summary.json.
    tolerance = s.get("nsd_tolerance_mm")
    nsd = f" NSD tolerance: {tolerance:g} mm." if tolerance is not None else ""
    return f"Empty masks: {s['empty_policy_text']}. Missing predictions: {s['missing_policy_text']}.{nsd}"


def cross_validation_lines(result: EvaluationResult) -> list[str]:
    """One line per cross-validation method: which folds were read, how many cases."""
    return [f"Cross-validation: {entry['text']}." for entry in (result.settings.get("cross_validation") or {}).values()]


def _stat_columns(result: EvaluationResult) -> list[str]:
    return (["n", "mean", "std", "median", "iqr"] + [percentile_column(q) for q in result.settings["percentiles"]]
            + [CVAR_COLUMN])


def _ranked(column: str) -> bool:
    return column in RANKED_COLUMNS or (column.startswith("p") and column[1:].replace(".", "", 1).isdigit())


def _format(value, metric: str, column: str) -> str:
    if column == "n":
        return str(int(value))
    return fmt(value, _decimals(metric))


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
                lower = not METRIC_INFO[metric].higher_is_better
                for _, comparison in block.groupby(["group", "region"], sort=False):
                    if "same_cases" in comparison and not comparison["same_cases"].all():
                        continue  # methods scored on different cases (--missing skip, --empty nan): no winner
                    for c in columns:
                        if not _ranked(c):
                            continue
                        shown = {idx: texts[idx][c] for idx in comparison.index if texts[idx][c] != "n/a"}
                        if len(shown) < 2 or len(shown) < len(comparison):
                            continue
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
    return METRIC_INFO[metric].decimals


def _signed(value, metric: str) -> str:
    """``+1.2`` / ``-0.4`` / ``+0.0`` (never ``-0.0``); ``n/a`` for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    d = _decimals(metric)
    return f"{round(float(value), d) + 0.0:+.{d}f}"


def _difference_cell(row, column: str, metric: str) -> str:
    text = _signed(row[column], metric)
    if text != "n/a":
        text = _with_interval(text, row, column, lambda v: _signed(v, metric))
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
    columns.append((f"{CVAR_COLUMN}_difference", f"Δ {CVAR_COLUMN}"))
    base = comparison["reference_method"].iloc[0]
    intervals = "; [95 % case-resampling bootstrap interval]" if result.settings.get("n_bootstrap") else ""
    lines = []
    for metric in result.settings["metrics"]:
        if metrics is not None and metric not in metrics:
            continue
        for group_column, block in comparison[comparison["metric"] == metric].groupby("group_column", sort=False):
            lines += [f"## {_title(metric, group_column)}: paired difference to {base}", "",
                      f"Method minus {base} on the cases both scored ({_direction_text(metric)}; "
                      f"pXX and {CVAR_COLUMN} of the worst cases by that direction){intervals}; "
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
             policy_line(result) + " " + TAIL_LINE + " " + BOLD_LINE, ""]
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
    lines += disparity_markdown(result, metrics)
    if result.runs is not None:
        lines += runs_markdown(result, metrics)
    return "\n".join(lines)


TAIL_LINE = (f"pXX: the value of the worst XX % of cases by the metric's direction (the XXth percentile where "
             f"higher is better, the (100 - XX)th where lower is better; numpy linear interpolation); "
             f"{CVAR_COLUMN}: the mean of the worst ceil(n / 10) cases; iqr = p75 - p25.")
BOLD_LINE = (f"Bold: the best mean, median, pXX and {CVAR_COLUMN} per group and region by the metric's direction, "
             f"only where every method was scored on the same cases; n, std and iqr are never bold.")


def _direction_text(metric: str) -> str:
    return f"{metric}: {'higher' if METRIC_INFO[metric].higher_is_better else 'lower'} is better"


def _with_interval(text: str, row, column: str, show) -> str:
    """``text`` followed by the interval of ``column`` (``<column>_ci_low`` / ``_high``) where the row has one."""
    low, high = row.get(f"{column}_ci_low"), row.get(f"{column}_ci_high")
    return text if is_missing(low) else f"{text} {interval_text(low, high, show)}"


def _interval_text(row, column: str, metric: str, signed: bool = False) -> str:
    value = row.get(column)
    if is_missing(value):
        return "n/a"
    show = (lambda v: _signed(v, metric)) if signed else (lambda v: f"{v:.{_decimals(metric)}f}")
    return _with_interval(show(value), row, column, show)


def disparity_markdown(result: EvaluationResult, metrics: list[str] | None = None) -> list[str]:
    """Markdown lines of the disparity between groups: one table per metric (group column, region,
    method rows): best and worst group, gap, ratio, equity-scaled score, change of the gap."""
    table = result.disparity
    if table is None or table.empty:
        return []
    several = table["method"].nunique() > 1
    intervals = " [95 % case-resampling bootstrap interval, cases resampled within groups]" \
        if result.settings.get("n_bootstrap") else ""
    lines = []
    for metric in result.settings["metrics"]:
        if metrics is not None and metric not in metrics:
            continue
        block = table[table["metric"] == metric]
        if block.empty:
            continue
        base = block["method"].iloc[0]
        header = "| group column | region | method | best group | worst group | gap | ratio | equity-scaled |"
        rule = "|---|---|---|---|---|---:|---:|---:|"
        if several:
            header += f" Δ gap vs {base} |"
            rule += "---:|"
        lines += [f"## {METRIC_TITLES[metric]}: gap between groups", "",
                  f"Group means; gap = how much better the best group does than the worst ({_direction_text(metric)}),"
                  f" ratio = smallest / largest group mean, equity-scaled = overall / (1 + sum of |group - overall|) "
                  f"on the 0-1 scale, in %{intervals}." + (f" Δ gap: method minus {base} on the cases both scored "
                                                          f"(negative: the gap shrank)." if several else ""), "",
                  header, rule]
        for _, row in block.iterrows():
            best = (f"{row['best_group']} ({row['best_mean']:.{_decimals(metric)}f})" if row["best_group"] else "n/a")
            worst = (f"{row['worst_group']} ({row['worst_mean']:.{_decimals(metric)}f})"
                     if row["worst_group"] else "n/a")
            cells = [row["group_column"], row["region"], row["method"], best, worst,
                     _interval_text(row, "gap", metric), _interval_text(row, "ratio", "hd95"),
                     _interval_text(row, "equity_scaled", metric)]
            if several:
                cells.append("–" if row["method"] == base else _interval_text(row, "gap_change", metric, signed=True))
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
    return lines


def gap_lines(result: EvaluationResult, metric: str) -> list[str]:
    """One line per group column: which method shrank the gap between the best and the worst group
    (per region), by how much, with its interval when ``--bootstrap`` was given."""
    table = result.disparity
    if table is None or table.empty or table["method"].nunique() < 2:
        return []
    block = table[table["metric"] == metric]
    base = block["method"].iloc[0]
    out = []
    for column, rows in block.groupby("group_column", sort=False):
        parts = []
        for region, by_region in rows.groupby("region", sort=False):
            base_gap = by_region.loc[by_region["method"] == base, "gap"].iloc[0]
            others = by_region[by_region["method"] != base]
            changes = others.dropna(subset=["gap_change"])
            if changes.empty:
                parts.append(f"{region}: no gap (fewer than two groups with scores)")
                continue
            best = changes.loc[changes["gap_change"].idxmin()]
            change = _interval_text(best, "gap_change", metric, signed=True)
            high = best.get("gap_change_ci_high")
            interval_known = high is not None and not (isinstance(high, float) and math.isnan(high))
            if best["gap_change"] < 0 and interval_known and high >= 0:
                # smaller on these cases, but the case-resampling interval includes no change (or growth)
                parts.append(f"{region}: {best['method']} smaller by {-best['gap_change']:.{_decimals(metric)}f}, "
                             f"its interval includes no change (Δ gap {change}; {base} gap "
                             f"{base_gap:.{_decimals(metric)}f})")
            elif best["gap_change"] < 0 and not interval_known:
                # no uncertainty (bootstrap off): on groups of a few cases a smaller gap is often
                # resampling noise, so the line states the difference and makes no claim
                parts.append(f"{region}: {best['method']}'s gap {-best['gap_change']:.{_decimals(metric)}f} smaller "
                             f"on these cases, no interval (--bootstrap N tells whether it is more than chance; "
                             f"Δ gap {change}; {base} gap {base_gap:.{_decimals(metric)}f})")
            elif best["gap_change"] < 0:
                parts.append(f"{region}: {best['method']} shrank it by {-best['gap_change']:.{_decimals(metric)}f} "
                             f"(Δ gap {change}; {base} gap {base_gap:.{_decimals(metric)}f})")
            else:
                parts.append(f"{region}: no method shrank it (smallest change {best['method']} {change}; {base} "
                             f"gap {base_gap:.{_decimals(metric)}f})")
        out.append(f"Gap by {column} ({METRIC_TITLES[metric]}, best - worst group mean, change vs {base}): "
                   + "; ".join(parts) + ".")
    return out


def runs_markdown(result: EvaluationResult, metrics: list[str] | None = None) -> list[str]:
    """The section 'Several trainings per method' (statistics over runs, :mod:`~.runs`)."""
    from nnunet_dro.evaluation.runs import markdown_section

    table = result.runs.table
    if metrics is not None:
        table = table[table["metric"].isin(metrics)]
    return markdown_section(table, METRIC_TITLES, result.runs.settings["paired"], result.runs.settings["n_bootstrap"],
                            {m: _decimals(m) for m in result.settings["metrics"]})


def terminal_table(result: EvaluationResult) -> str:
    """The main table for the terminal: the first metric, every grouping, its paired comparison
    with the first method, one line per group column on the gap between groups, and where the
    other metrics are."""
    metrics = result.settings["metrics"]
    text = markdown_tables(result, metrics=[metrics[0]]).rstrip() + "\n"
    extra = gap_lines(result, metrics[0])
    if len(metrics) > 1:
        where = os.path.join(result.output_folder, "table.md") if result.output_folder else "table.md"
        extra.append(f"Shown: {metrics[0]} only; {', '.join(metrics[1:])} {'is' if len(metrics) == 2 else 'are'} "
                     f"in {where}.")
    return text + ("\n" + "\n".join(extra) + "\n" if extra else "")


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
    out += _latex_disparity(result)
    return "\n".join(out)


def _latex_disparity(result: EvaluationResult) -> list[str]:
    table = result.disparity
    if table is None or table.empty:
        return []
    several = table["method"].nunique() > 1
    out = []
    for metric in result.settings["metrics"]:
        block = table[table["metric"] == metric]
        base = block["method"].iloc[0]
        heads = ["Group column", "Region", "Method", "Best group", "Worst group", "Gap", "Ratio", "Equity-scaled"]
        if several:
            heads.append(f"Δ gap vs {base}")
        out += ["\\begin{table}[ht]", "\\centering",
                f"\\caption{{{latex_escape(METRIC_TITLES[metric])}: gap between the best and the worst group "
                f"mean ({latex_escape(_direction_text(metric))}); intervals: case-resampling bootstrap within "
                f"groups.}}",
                "\\begin{tabular}{lllll" + "r" * (len(heads) - 5) + "}", "\\toprule",
                " & ".join(latex_escape(h) for h in heads) + " \\\\", "\\midrule"]
        for _, row in block.iterrows():
            cells = [row["group_column"], row["region"], row["method"], row["best_group"] or "n/a",
                     row["worst_group"] or "n/a", _interval_text(row, "gap", metric),
                     _interval_text(row, "ratio", "hd95"), _interval_text(row, "equity_scaled", metric)]
            if several:
                cells.append("--" if row["method"] == base else _interval_text(row, "gap_change", metric, signed=True))
            out.append(" & ".join(latex_escape(c) for c in cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return out


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
    # top: 0.95 inch above the panels for the figure's title, the legend and the first row's titles
    # (0.5 let the figure's title run into the first panel's)
    figure.subplots_adjust(left=0.06 if len(regions) > 1 else 0.15, right=0.98, top=1 - 0.95 / (3.8 * rows),
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
                      loc="upper left", bbox_to_anchor=(0.005, 1 - 0.3 / (3.8 * rows)), fontsize=7,
                      ncols=len(methods), frameon=False)
    figure.suptitle(f"{METRIC_TITLES[metric]} per case (--empty {result.settings['empty_policy']}, "
                    f"--missing {result.settings['missing_policy']})", fontsize=9, y=1 - 0.08 / (3.8 * rows),
                    va="top")
    figure.savefig(path, dpi=100)


def write_disparity_figure(path: Path, result: EvaluationResult, metric: str) -> None:
    """Per group column and region (one panel each): each method's group means (filled) and
    CVaR10 (open), with their case-resampling bootstrap intervals when ``--bootstrap`` was given,
    and the gap between its best and worst group mean drawn as a bracket at the right."""
    disparity_figure(result, metric).savefig(path, dpi=100)


def disparity_figure(result: EvaluationResult, metric: str):
    """The figure of :func:`write_disparity_figure` (a matplotlib Figure on an Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    summary = result.summary[(result.summary["metric"] == metric) & (result.summary["group_column"] != ALL)]
    disparity = result.disparity[result.disparity["metric"] == metric]
    methods = list(result.settings["predictions"])
    panels = [(c, r.name) for c in result.group_columns for r in result.regions]
    ncols = min(len(panels), 3)
    rows = math.ceil(len(panels) / ncols)
    figure = Figure(figsize=(4.6 * ncols, 3.9 * rows))
    figure.subplots_adjust(left=0.08, right=0.97, top=1 - 0.75 / (3.9 * rows), bottom=0.9 / (3.9 * rows),
                           wspace=0.3, hspace=0.65)
    FigureCanvasAgg(figure)
    step = 0.8 / max(len(methods), 1)
    for k, (column, region) in enumerate(panels):
        axis = figure.add_subplot(rows, ncols, k + 1)
        data = summary[(summary["group_column"] == column) & (summary["region"] == region)]
        groups = list(dict.fromkeys(data["group"]))
        labels = []  # (method index, bracket x, bracket middle, text): placed once the limits are known
        for i, method in enumerate(methods):
            rows_m = data[data["method"] == method].set_index("group").reindex(groups)
            x = np.arange(len(groups)) - 0.4 + step * (i + 0.5)
            for statistic, marker, fill, shift in (("mean", "o", f"C{i}", 0.0), (CVAR_COLUMN, "v", "none", step / 3)):
                y = rows_m[statistic].to_numpy(float)
                if f"{statistic}_ci_low" in rows_m:
                    low, high = rows_m[f"{statistic}_ci_low"].to_numpy(float), rows_m[f"{statistic}_ci_high"]
                    error = np.vstack([y - low, high.to_numpy(float) - y])
                else:
                    error = None
                axis.errorbar(x + shift, y, yerr=error, fmt=marker, color=f"C{i}", markerfacecolor=fill, capsize=2,
                              markersize=5, linewidth=1, label=f"{method} {statistic}" if k == 0 else None)
            gap = disparity[(disparity["group_column"] == column) & (disparity["region"] == region)
                            & (disparity["method"] == method)]
            if not gap.empty and not math.isnan(gap["gap"].iloc[0]):
                g = gap.iloc[0]
                bracket_x = len(groups) - 0.35 + 0.12 * i
                axis.plot([bracket_x] * 2, [g["worst_mean"], g["best_mean"]], color=f"C{i}", linewidth=2)
                labels.append((i, bracket_x, (g["worst_mean"] + g["best_mean"]) / 2,
                               f"gap {g['gap']:.{_decimals(metric)}f}"))
        # The gap's label beside its bracket, its centre kept within 20-80 % of the panel's height:
        # centred on a bracket near the top (Dice near 100) it ran past the panel and was cut off.
        low, high = axis.get_ylim()
        data_x_axes_y = blended_transform_factory(axis.transData, axis.transAxes)
        for i, bracket_x, middle, text in labels:
            fraction = min(max((middle - low) / (high - low) if high > low else 0.5, 0.2), 0.8)
            axis.annotate(text, (bracket_x, fraction), xycoords=data_x_axes_y, xytext=(3, 0),
                          textcoords="offset points", fontsize=7, color=f"C{i}", rotation=90, va="center")
        axis.set_xticks(range(len(groups)))
        axis.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
        axis.set_xlim(-0.6, len(groups) + 0.2 + 0.12 * len(methods))
        axis.set_title(f"{region}, by {column}", fontsize=9)
        axis.set_ylabel(METRIC_TITLES[metric], fontsize=8)
        axis.grid(axis="y", alpha=0.3)
    intervals = "95 % case-resampling bootstrap intervals" if result.settings.get("n_bootstrap") else \
        "no intervals (--bootstrap N)"
    figure.legend(loc="upper left", bbox_to_anchor=(0.005, 1.0), fontsize=7, ncols=min(2 * len(methods), 6),
                  frameon=False)
    figure.suptitle(f"{METRIC_TITLES[metric]}: group mean (filled) and {CVAR_COLUMN} (open), {intervals}; "
                    f"bar: gap best - worst group", fontsize=8, x=0.99, ha="right")
    return figure
