"""The discovery's output folder: ``report.md``, ``groups.json``, ``subgroups.tsv``, ``features.tsv``.

``subgroups.tsv`` has the format of ``data_docs/subgroup_table.md`` with one group column,
``discovered_group`` (``g1`` the hardest group, ``g2`` the next...), so that it feeds
``nnunet_dro evaluate -groups subgroups.tsv --group-by discovered_group`` and the group trainers
(``nnUNet_dro_subgroups``, ``nnUNet_dro_group_column=discovered_group``) unchanged. The folder is
written as a whole (:func:`nnunet_dro.atomic.atomic_path`): a failed run leaves the previous one.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from nnunet_dro.atomic import atomic_path
from nnunet_dro.data.subgroups import write_subgroups
from nnunet_dro.errors import UserError

GROUP_COLUMN = "discovered_group"
#: files of a discovery folder: an existing folder holding other files is not replaced
OUTPUT_FILES = ("report.md", "groups.json", "subgroups.tsv", "features.tsv")


def group_name(index: int) -> str:
    """Group 0 (the hardest) is ``g1``.

    >>> group_name(0), group_name(2)
    ('g1', 'g3')
    """
    return f"g{index + 1}"


def check_output(folder: str | Path) -> Path:
    """The output folder may be new, empty, or a previous discovery's; anything else is refused
    (replacing it would delete the user's files)."""
    from nnunet_dro.atomic import check_output_folder

    folder = check_output_folder(folder, "-o")
    if folder.is_dir():
        others = sorted(p.name for p in folder.iterdir() if p.name not in OUTPUT_FILES)
        if others:
            raise UserError(f"-o {folder}: holds files that are not a discovery's ({', '.join(others[:3])}); "
                            f"choose a new or empty folder")
    return folder


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _interval(row: dict, stat: str) -> str:
    low, high = row[f"diff_{stat}_low"], row[f"diff_{stat}_high"]
    diff = f"{row[f'diff_{stat}']:+.1f}"
    return diff if low is None or (isinstance(low, float) and math.isnan(low)) else f"{diff} [{low:+.1f}, {high:+.1f}]"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def report_markdown(summary: dict) -> str:
    """The human-readable report of a discovery (``summary`` as written to groups.json)."""
    s = summary["settings"]
    lines = ["# Discovered subgroups", "",
             f"{summary['n_cases']} cases from {s['source']}; features: {', '.join(s['feature_kinds'])}. "
             f"{s['not_used']}",
             f"Clustering: diagonal Gaussian mixture, error features counted {s['error_weight']} times, components "
             f"merged where their mean errors differ by less than {s.get('merge_distance', 0):g} robust SD on every "
             f"error column, number of groups by the lowest BIC among those whose smallest group has at least "
             f"{s['min_size']} cases (--min-size {s.get('min_size_given', s['min_size'])}): "
             f"**{summary['k']} group{'s' if summary['k'] > 1 else ''}**.", ""]
    if summary["k"] == 1:
        lines += ["No group stands out: every case is in g1.", ""]
    if summary.get("blocked"):
        lines += [_sentence(summary["blocked"]["text"][len("note: "):]), ""]
    lines += ["Intervals are 95 % case-resampling bootstrap intervals "
              f"({s['n_bootstrap']} resamples of the group's and the rest's cases) of group - rest: they say how "
              "sure the gap is for these cases, not how another training would fare.", ""]
    for group in summary["groups"]:
        flag = " — **suspect labels**" if group["suspect_labels"] else ""
        lines += [f"## {group['name']}: {group['size']} cases{flag}", ""]
        if group["features"]:
            lines += ["What sets it apart: " + "; ".join(f["text"] for f in group["features"]) + ".", ""]
        else:
            lines += ["No feature differs from the rest by half a robust standard deviation or more.", ""]
        if group["suspect_labels"]:
            lines += [f"{group['audit_flagged']} of its {group['size']} cases carry a label-audit flag "
                      "(`nnunet_dro audit-labels`): open them before trusting or training on the group.", ""]
        elif group["audit_flagged"] * 2 >= group["size"]:
            shared = group["shared_audit_flag"]
            lines += [f"{group['audit_flagged']} of its {group['size']} cases carry a label-audit flag, "
                      f"{shared['share']:.0%} of them the same one ({shared['flag']}): more likely a real anatomy "
                      "than label faults; open a few cases to be sure.", ""]
        if group["tail"]:
            lines += ["| region | mean (group / rest) | p10 | CVaR10 | mean diff [95% CI] | p10 diff | CVaR10 diff |",
                      "|---|---|---|---|---|---|---|"]
            for row in group["tail"]:
                lines.append(f"| {row['region']} | {row['group_mean']:.1f} / {row['rest_mean']:.1f} | "
                             f"{row['group_p10']:.1f} / {row['rest_p10']:.1f} | "
                             f"{row['group_cvar10']:.1f} / {row['rest_cvar10']:.1f} | {_interval(row, 'mean')} | "
                             f"{_interval(row, 'p10')} | {_interval(row, 'cvar10')} |"
                             if row["n_rest"] else f"| {row['region']} | {row['group_mean']:.1f} / - | - | - | - | - | - |")
            lines.append("")
        shown = group["cases"][:20]
        lines += [f"Cases: {', '.join(shown)}{' ...' if len(group['cases']) > 20 else ''}", ""]
    lines += ["## Acting on a group", "",
              f"`nnunet_dro evaluate -groups subgroups.tsv --group-by {GROUP_COLUMN} ...` scores it; "
              "`nnUNet_dro_subgroups=subgroups.tsv nnUNet_dro_group_column=discovered_group` trains on it "
              "(`nnUNetTrainerGroupBalanced`, `nnUNetTrainerGroupDRO`). See the section Discovering hard subgroups nobody labelled of docs/evaluation.md.", ""]
    return "\n".join(lines)


def write_outputs(folder: str | Path, summary: dict, features: pd.DataFrame) -> None:
    """Write the four files into ``folder`` at once (the folder is replaced as a whole)."""
    table = pd.DataFrame({"case": features.index.astype(str), GROUP_COLUMN: features[GROUP_COLUMN].to_numpy()})
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        write_subgroups(tmp / "subgroups.tsv", table)
        (tmp / "groups.json").write_text(json.dumps(_clean(summary), indent=2), encoding="utf-8")
        (tmp / "report.md").write_text(report_markdown(summary), encoding="utf-8")
        features.reset_index().to_csv(tmp / "features.tsv", sep="\t", index=False, float_format="%.6g")
