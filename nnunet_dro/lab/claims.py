"""The evidence pages' claims as data: one row of ``data_docs/benchmark_record/claims.csv`` per
claim a page makes (which cells of ``evidence_intervals.csv`` it reads, by which word's rule, and
the figure it quotes), and the marker ``<!-- claim:ID -->`` that ties the row to its clause of the
page (an HTML comment: the rendered page does not show it). ``tests/test_figures.py`` checks each
row's rule on the stored table, that every marker has its row and every row its marker, that the
quoted figure is the cell's at the precision printed, and that no clause of the record's sections
uses a rule word without a marker.

The words' rules (docs/evidence.md's table "The words, and their rule"), on one stored cell:

>>> cell = pd.Series({"seeds": 3, "mean": 10.61, "ci_seeds_low": 3.04, "ci_seeds_high": 18.18, "signs": "+++"})
>>> [holds(word, cell) for word in ("lifts", "costs", "within 0.5", "holds 0", "rises on every seed")]
[True, False, False, False, True]
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.lab.decision_rule import MARGIN

#: the comparison column of the evidence table, per baseline a claim row names
COMPARISONS = {"ERM": "minus ERM", "DROAdaptive": "minus DROAdaptive",
               "noise floor": "noise floor: ERM's second run minus its first"}
#: names a claim row may give a list of statistics by
STATISTIC_GROUPS = {
    "controls": ("control white_matter mean", "control intra_axial_csf mean", "control cerebellum mean"),
    "minority p10s": ("spina_bifida cerebellum p10", "other intra_axial_csf p10"),
}
STATISTIC_GROUPS["all"] = STATISTIC_GROUPS["minority p10s"] + STATISTIC_GROUPS["controls"]
#: an interval needs this many seeds before a word may be said of it (one seed: a hint, never a claim)
MIN_SEEDS = 3
MARKER = re.compile(r"<!-- claim:([\w-]+) -->")


def _cell_rule(word: str, cell: pd.Series) -> bool | None:
    """The rule of one word on one cell; None for a word that is not a cell rule."""
    low, high, enough = cell["ci_seeds_low"], cell["ci_seeds_high"], int(cell["seeds"]) >= MIN_SEEDS
    if word == "lifts":
        return enough and low > 0
    if word == "costs":
        return enough and high < 0
    if word.startswith("within "):
        bound = float(word.split()[1])
        return enough and -bound <= low and high <= bound
    if word == "holds 0":  # "cannot be told apart", "not shown"
        return bool(low <= 0 <= high)
    if word == "rises on every seed":
        return set(cell["signs"]) == {"+"}
    if word == "falls on every seed":
        return set(cell["signs"]) == {"-"}
    if word == "mean above 0":  # "5.6 below JTT's": a point estimate, no interval claimed
        return bool(cell["mean"] > 0)
    if word == "quotes":  # the clause only quotes the cell's figure
        return True
    if re.fullmatch(r"on \d+ seeds", word):
        return int(cell["seeds"]) == int(word.split()[1])
    return None


def holds(word: str, cell: pd.Series) -> bool:
    """Whether ``word`` holds on ``cell`` (a row of the evidence table)."""
    verdict = _cell_rule(word, cell)
    if verdict is None:
        raise UserError(f"claims.csv: no rule for the word {word!r}")
    return verdict


@dataclass(frozen=True)
class Claim:
    """One row of claims.csv."""

    claim: str
    page: str
    record: str
    cases: str
    baseline: str
    method: str
    statistic: str
    rule: str
    figure: str

    @property
    def records(self) -> list[str]:
        return self.record.split(";")

    @property
    def methods(self) -> list[str]:
        return self.method.split(";")

    @property
    def statistics(self) -> list[str]:
        return [s for name in self.statistic.split(";") for s in STATISTIC_GROUPS.get(name, (name,))]


def read_claims(path: Path) -> list[Claim]:
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    claims = [Claim(**row) for row in table.to_dict("records")]
    duplicated = table["claim"][table["claim"].duplicated()].tolist()
    if duplicated:
        raise UserError(f"{path}: claim id {duplicated[0]!r} is on two rows")
    return claims


def cells(table: pd.DataFrame, claim: Claim, methods: list[str] | None = None,
          statistics: list[str] | None = None) -> list[pd.Series]:
    """The stored cells a claim reads, one per (method, statistic); a missing cell is an error."""
    comparison = COMPARISONS[claim.baseline]
    found = []
    for record in claim.records:
        for method in methods or claim.methods:
            for statistic in statistics or claim.statistics:
                rows = table[(table["record"] == record) & (table["method"] == method)
                             & (table["statistic"] == statistic) & (table["comparison"] == comparison)]
                if len(rows) != 1:
                    raise UserError(f"claims.csv: {claim.claim}: no single cell {record} {method} "
                                    f"{statistic} {comparison}")
                found.append(rows.iloc[0])
    return found


def rule_holds(claim: Claim, table: pd.DataFrame, verdicts: dict[str, set[str]]) -> bool:
    """The claim's rule on its cells: ``WORD`` holds on every cell; ``not WORD`` on none; ``only WORD``
    on every cell and on none of the same methods' other statistics; ``[not] above the others``: a
    cell's interval lies above every other listed method's point estimate on that statistic;
    ``[not] meets RULE``: the method is among those ``verdicts[RULE]`` names (the decision rules)."""
    negated, only = claim.rule.startswith("not "), claim.rule.startswith("only ")
    word = claim.rule.removeprefix("not ").removeprefix("only ")
    if word.startswith("meets "):
        if word not in verdicts:
            raise UserError(f"claims.csv: {claim.claim}: no verdict for {word!r}")
        met = [method in verdicts[word] for method in claim.methods]
        return not any(met) if negated else all(met)
    if word == "above the others":
        met = []
        for statistic in claim.statistics:
            by_method = {c["method"]: c for c in cells(table, claim, statistics=[statistic])}
            met += [c["ci_seeds_low"] > max(o["mean"] for m, o in by_method.items() if m != method)
                    for method, c in by_method.items()]
        return not any(met) if negated else all(met)
    met = [holds(word, c) for c in cells(table, claim)]
    if negated:
        return not any(met)
    if only:
        rest = [s for s in STATISTIC_GROUPS["all"] if s not in claim.statistics]
        return all(met) and not any(holds(word, c) for c in cells(table, claim, statistics=rest))
    return all(met)


def figure_text(claim: Claim, table: pd.DataFrame) -> str:
    """The claim's figure template filled from its one cell at the precision the pages print:
    ``{mean} ({low} to {high})`` -> ``+5.7 (0.2 to 11.2)``; ``{n}`` seeds; ``{seed[33]}`` one seed's
    gain; ``{size}`` the mean without its sign ("5.6 below"); ``{miss}`` how far the lower bound lies
    below the decision rule's control margin, -MARGIN ("miss by up to 1.0")."""
    found = cells(table, claim)
    if len(found) != 1:
        raise UserError(f"claims.csv: {claim.claim}: a figure needs one cell, the row names {len(found)}")
    cell = found[0]
    per_seed = dict(zip((int(s) for s in cell["seed_list"].split()), cell["gain_per_seed"].split()))
    low = cell["ci_seeds_low"]
    return claim.figure.format(mean=f"{cell['mean']:+.1f}", low=f"{low:.1f}", high=f"{cell['ci_seeds_high']:.1f}",
                               n=int(cell["seeds"]), seed=per_seed, size=f"{abs(cell['mean']):.1f}",
                               miss=f"{-MARGIN - low:.1f}")


def clauses(text: str) -> list[str]:
    """A page's prose as clauses, whitespace folded: split after ``.`` or ``;`` (and a closing
    ``**``) and the space that follows, at a blank line and before a list item; markers right
    after a clause's end stay with it, and the next clause starts after them. Table rows, code blocks and headings are left out."""
    prose, in_code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        keep = not in_code and not line.startswith(("|", "#", "```"))
        if keep and re.match(r"\s*- ", line):
            prose.append("")  # a list item starts a paragraph of its own
        prose.append(line if keep else "")
    found = []
    for paragraph in re.split(r"\n\s*\n", "\n".join(prose)):
        flat = " ".join(paragraph.split())
        found += [c for c in re.split(r"(?:(?<=[.;])|(?<=-->))(?:\*\*)?\s+(?!<!-- claim:)", flat) if c]
    return found


def markers(clause: str) -> list[str]:
    return MARKER.findall(clause)


def section(text: str, start: str, end: str | None) -> str:
    """The lines of ``text`` from the first that starts with ``start`` up to the first after it that
    starts with ``end`` (or the end of the page); an error names the line not found."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    if first is None:
        raise UserError(f"no line starts with {start!r}")
    last = next((i for i in range(first + 1, len(lines)) if end and lines[i].startswith(end)), len(lines))
    return "\n".join(lines[first:last])
