"""The evidence figures of the README and the docs are the stored record's, and every word of the
evidence rules ("lifts", "within 0.5", "ahead of", "cannot be told apart", "on every seed") holds
where the pages use it.

One table carries the figures: ``data_docs/benchmark_record/evidence_intervals.csv``, made from the
record's per-case files by ``scripts/evidence_intervals.py`` (paired gains per seed, their mean,
95 % t-interval over seeds and signs). The claims are data: ``data_docs/benchmark_record/claims.csv``,
one row per claim (the cells it reads, the word's rule, the figure it quotes), tied to its clause of
the page by a marker ``<!-- claim:ID -->`` (``nnunet_dro.lab.claims``). A record file, the script, a
claim row or a page edited on its own fails here instead of letting the pages drift apart.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.lab import claims
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "data_docs" / "benchmark_record"
EVIDENCE = ROOT / "docs" / "evidence.md"
README = ROOT / "README.md"
METHODS = ROOT / "docs" / "methods.md"
CHOOSING = ROOT / "docs" / "choosing-robustness.md"
CLAIMS = claims.read_claims(RECORDS / "claims.csv")


SCRIPT = load_script("evidence_intervals")


@pytest.fixture(scope="module")
def fresh() -> pd.DataFrame:
    """The table as the record gives it now."""
    return SCRIPT.evidence_table()


@pytest.fixture(scope="module")
def stored() -> pd.DataFrame:
    return pd.read_csv(SCRIPT.OUTPUT)


@pytest.fixture(scope="module")
def stored_new_centre() -> pd.DataFrame:
    """The same over the new centre's cases (the records that scored them)."""
    return pd.read_csv(SCRIPT.OUTPUTS["shifted_test"])


def row(table: pd.DataFrame, record: str, method: str, statistic: str, baseline: str = "ERM") -> pd.Series:
    comparison = "noise floor: ERM's second run minus its first" if method == "ERM again" else f"minus {baseline}"
    method = "ERM" if method == "ERM again" else method
    rows = table[(table["record"] == record) & (table["method"] == method) & (table["statistic"] == statistic)
                 & (table["comparison"] == comparison)]
    assert len(rows) == 1, (record, method, statistic, baseline)
    return rows.iloc[0]


def test_stored_table_is_what_the_record_gives(fresh, stored):
    assert SCRIPT.main(["--check"]) == 0
    pd.testing.assert_frame_equal(fresh.reset_index(drop=True), stored, check_dtype=False)


def test_one_cell_against_the_evaluations_own_percentile():
    """The script's p10 per run, computed again from one run's per-case file with the evaluation's
    ``summarize`` (an independent path through the record)."""
    from nnunet_dro.evaluation.stats import summarize

    table = pd.read_csv(RECORDS / "alternatives177_240" / "per_case_large_test.csv")
    runs = SCRIPT.per_run_statistics(table)

    def p10(method, seed):
        cases = table[(table.method == method) & (table.seed == seed) & (table.metric == "dice")
                      & (table.condition == "other") & (table.region == "intra_axial_csf")]
        return summarize(cases.value, [10])["p10"]

    for seed in (13, 15):
        mine = runs[(runs.method == "ERM") & (runs.seed == seed)
                    & (runs.statistic == "other intra_axial_csf p10")].set_index("run")["value"]
        assert mine[1] == pytest.approx(p10("ERM", seed))
        assert mine[2] == pytest.approx(p10("ERM_repeat", seed))


def test_interval_over_seeds_is_a_t_interval():
    from scipy import stats

    gains = np.array([11.1, 13.4, 7.4])
    low, high = SCRIPT.interval_over_seeds(gains)
    half = stats.t.ppf(0.975, 2) * gains.std(ddof=1) / np.sqrt(3)
    assert (low, high) == pytest.approx((gains.mean() - half, gains.mean() + half))
    assert np.isnan(SCRIPT.interval_over_seeds(np.array([4.0]))[0])


def evidence_tables(page: Path) -> list[list[str]]:
    """Every table of ``page`` whose header starts with ``| RECORD: minus BASELINE |``."""
    lines, tables = page.read_text().splitlines(), []
    for i, line in enumerate(lines):
        if re.match(r"\| \w+: minus \w+ \|", line):
            block = []
            for table_line in lines[i:]:
                if not table_line.startswith("|"):
                    break
                block.append(table_line)
            tables.append(block)
    return tables


def test_evidence_tables_are_the_scripts_output(stored, stored_new_centre):
    tables = evidence_tables(EVIDENCE)
    assert len(tables) >= 6
    for block in tables:
        title, baseline = re.match(r"\| (\w+): minus (\w+) \|", block[0]).groups()
        record = title.removesuffix(SCRIPT.NEW_CENTRE_SUFFIX)
        table = stored if record == title else stored_new_centre
        labels = {v: k for k, v in SCRIPT.LABELS.items()} | {"ERM again (noise floor)": "ERM"}
        methods = tuple(labels.get(line.split("|")[1].strip(), line.split("|")[1].strip()) for line in block[2:])
        expected = SCRIPT.markdown_table(table, record, baseline, methods, title)
        assert block == expected, f"docs/evidence.md's table for {title} minus {baseline} is not the record's"


INTERVAL = re.compile(r"([+-]\d+\.\d) \((-?\d+\.\d) to (-?\d+\.\d)\)")


@pytest.mark.parametrize("page", [README, EVIDENCE, METHODS])
def test_every_interval_quoted_is_a_cell_of_the_table(page, stored, stored_new_centre):
    cells = {(f"{r['mean']:+.1f}", f"{r['ci_seeds_low']:.1f}", f"{r['ci_seeds_high']:.1f}")
             for _, r in pd.concat([stored, stored_new_centre]).iterrows()}
    text = " ".join(page.read_text().split())
    quoted = INTERVAL.findall(text)
    assert quoted, page
    for figure in quoted:
        assert figure in cells, f"{page.name}: {figure[0]} ({figure[1]} to {figure[2]}) is not in the record"


CONTROLS = [f"control {region} mean" for region in ("white_matter", "intra_axial_csf", "cerebellum")]
#: the statistics of the decision tables
STATISTICS = ["spina_bifida cerebellum p10", "other intra_axial_csf p10", *CONTROLS]


@pytest.fixture(scope="module")
def tables(stored, stored_new_centre) -> dict[str, pd.DataFrame]:
    """The stored table per test cases a claim row names."""
    return {"large_test": stored, "shifted_test": stored_new_centre}


@pytest.fixture(scope="module")
def verdicts(stored) -> dict[str, set[str]]:
    """The methods each decision rule passes, for the rows whose rule is ``[not] meets ...``: the
    December 5 rule (``decision``) and issue 78's (``rule_verdict``), with its two clauses."""
    december_5 = SCRIPT.decision(stored)
    verdict, _ = SCRIPT.rule_verdict()
    arms = verdict.arms.set_index("method")
    return {"meets the December 5 rule": set(december_5["method"][december_5["meets_rule"]]),
            "meets issue 78's rule": set(arms.index[arms["eligible"]]),
            "meets Holm's adjustment": set(arms.index[arms["primary_above_0"]]),
            "meets the margin": set(arms.index[arms["controls_noninferior"]])}


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.claim for c in CLAIMS])
def test_every_claim_holds_by_its_rule(claim, tables, verdicts):
    assert claims.rule_holds(claim, tables[claim.cases], verdicts), \
        f"claims.csv: {claim.claim} ({claim.page}): {claim.rule!r} does not hold on {claim.record} {claim.method} " \
        f"{claim.statistic} ({claim.cases}, against {claim.baseline})"


def marked_clauses(page: str) -> dict[str, list[str]]:
    """Claim id -> the clauses of ``page`` that carry its marker."""
    found: dict[str, list[str]] = {}
    for clause in claims.clauses((ROOT / page).read_text()):
        for claim_id in claims.markers(clause):
            found.setdefault(claim_id, []).append(clause)
    return found


PAGES = sorted({c.page for c in CLAIMS})


@pytest.mark.parametrize("page", PAGES)
def test_every_marker_has_its_row_and_every_row_its_marker(page):
    marked = marked_clauses(page)
    rows = {c.claim for c in CLAIMS if c.page == page}
    assert not set(marked) - rows, f"{page}: markers without a row in claims.csv: {sorted(set(marked) - rows)}"
    assert not rows - set(marked), f"{page}: claims.csv rows not marked in the page: {sorted(rows - set(marked))}"
    twice = [claim_id for claim_id, where in marked.items() if len(where) > 1]
    assert not twice, f"{page}: marked more than once: {twice}"


FIGURED = [c for c in CLAIMS if c.figure]


@pytest.mark.parametrize("claim", FIGURED, ids=[c.claim for c in FIGURED])
def test_the_figure_a_clause_quotes_is_its_cell(claim, tables):
    """The figure in the marked clause, at the precision printed, is the stored cell's."""
    (clause,) = marked_clauses(claim.page)[claim.claim]
    figure = claims.figure_text(claim, tables[claim.cases])
    assert figure in clause, f"{claim.page}: {claim.claim} should quote {figure!r} (the record's) in: {clause}"


#: a rule's word (docs/evidence.md's table "The words, and their rule"), in any of its forms
RULE_WORDS = re.compile(r"\b(lifts?|lifted|costs?|lower(s|ed)|within|ahead|every seed|all \d+ seeds|told apart|shown"
                        r"|holds 0|above 0(?![.\d])|below 0(?![.\d])|meets? the rule|met the rule|as good as)\b", re.IGNORECASE)
#: the parts of each page that read the record (page -> first line, first line after)
READS_THE_RECORD = {
    "README.md": ("## Evidence", "## Documentation"),
    "docs/evidence.md": ("## What the default does", "## What it costs"),
    "docs/choosing-robustness.md": ("## Which to use when", "## Fixed beta"),
    "docs/methods.md": ("**What it does on our cohorts", "So GI-LS as shipped"),
}
#: clauses there that use a rule word and are no claim on the evidence table (page, fragment): why
NOT_CLAIMS = {
    ("README.md", "**Bottom line:**"): "made by evidence_intervals.py --bottom-line (test_readme_bottom_line...)",
    ("docs/evidence.md", "the controls within a point) is not met."): "the target, read by the decision rows",
    ("docs/evidence.md", "It costs a second training."): "the cost in trainings, not a statistic",
    ("docs/evidence.md", "a candidate becomes the default only if"): "the December 5 rule, defined",
    ("docs/evidence.md", "eligible means an \"other\" CSF p10 gain above 0"): "issue 78's rule, defined",
    ("docs/choosing-robustness.md", "**The bottom line** (the README's)"): "the README's, generated",
    ("docs/methods.md", "by epoch 39-137 on every seed."): "runs.csv (test_gils_runs_are_the_record)",
    ("docs/methods.md", "finest scale was below"): "the training logs' shift, not the table",
    ("docs/methods.md", "every structure learned on every seed: missed"): "runs.csv (test_gils_runs_are_the_record)",
}
#: words issue 78 corrected: no page may use them again (no margin makes "as good as" true)
NEVER = ("within about a point", "lifted by one arm only", "at a small cost to the majority",
         "with a higher point estimate than the default's", "as good as")
#: what a page says of figures with no interval, which must stay said
HINTS = {"docs/evidence.md": ("in each of the two runs it measured: no interval, a hint, not a result",)}


@pytest.mark.parametrize("page", sorted(READS_THE_RECORD))
def test_no_rule_word_about_the_record_without_a_claim(page):
    text = claims.section((ROOT / page).read_text(), *READS_THE_RECORD[page])
    allowed = [fragment for (where, fragment) in NOT_CLAIMS if where == page]
    worded = [clause for clause in claims.clauses(text) if RULE_WORDS.search(clause) and not claims.markers(clause)]
    unmarked = [clause for clause in worded if not any(fragment in clause for fragment in allowed)]
    assert not unmarked, f"{page}: a rule word without a claim marker (add a row to claims.csv): {unmarked}"
    unused = [fragment for fragment in allowed if not any(fragment in clause for clause in worded)]
    assert not unused, f"{page}: NOT_CLAIMS names no unmarked clause with a rule word: {unused}"
    folded = " ".join((ROOT / page).read_text().split())
    assert not [phrase for phrase in NEVER if phrase in folded], page
    assert all(hint in folded for hint in HINTS.get(page, ())), page


def test_the_decision_counts_only_seeds_where_erm_learned_the_majority(stored):
    """The amendment (journal, before seeds 35-37 were read): on seed 33 both ERM runs left the
    controls' CSF below 80, and the default never left its ERM phase (it drew uniformly, so its lost
    cerebellum is not the weighting's); the decision table holds exactly the seeds ERM learned."""
    runs = pd.read_csv(RECORDS / "decision40_24_200" / "runs.csv")
    kept = SCRIPT.learned_seeds(runs)
    assert 33 not in kept and {30, 31, 32, 34} <= set(kept)
    erm = runs[(runs["seed"] == 33) & runs["arm"].isin(["ERM", "ERM_repeat"])]
    assert len(erm) == 2 and all(ast.literal_eval(m)["intra_axial_csf"] < 80 for m in erm["control_mean_dice"])
    default = runs[(runs["seed"] == 33) & (runs["arm"] == "DROAdaptive")].iloc[0]
    assert pd.isna(default["dro_robust_from_epoch"]) and default["dro_beta_mean"] < 1e-9
    table = stored[stored["record"] == SCRIPT.DECISION["record"]]
    seeds = {int(s) for listed in table["seed_list"] for s in listed.split()}
    assert 33 not in seeds and seeds <= set(kept) and {30, 31, 32, 34} <= seeds
    page = " ".join(EVIDENCE.read_text().split())
    assert "never left its ERM phase" in page and "Seed 33 does not count" in page



def test_gils_runs_are_the_record():
    """docs/methods.md's and docs/evidence.md's reading of the GI-LS runs' learning (the record's
    runs.csv: the epoch each run had every structure at a pseudo-Dice of at least 0.2), and the
    counting seeds it names; the words on its gains are claim rows."""
    methods = " ".join(METHODS.read_text().split())
    page = " ".join(EVIDENCE.read_text().split())
    runs = pd.read_csv(RECORDS / "decision40_24_200" / "runs.csv")
    counting = SCRIPT.learned_seeds(runs)
    assert counting == [30, 31, 32, 34, 35, 36, 37, 38] and "on its 8 counting seeds (30-32, 34-38)" in methods
    learned_by = runs[runs["seed"].isin(counting)].pivot(index="seed", columns="arm", values="all_learned_epoch")
    unlearned = {arm: {int(s) for s in learned_by.index[learned_by[arm].isna()]} for arm in ("DROLS", "DROLS_DRO")}
    assert unlearned == {"DROLS": {30, 31, 32, 35, 38}, "DROLS_DRO": {30, 31, 32, 35, 36, 38}}, unlearned
    assert learned_by["ERM"].notna().all() and (learned_by["ERM"].min(), learned_by["ERM"].max()) == (39, 137)
    assert "ERM had every structure at a pseudo-Dice of at least 0.2 by epoch 39-137 on every seed" in methods
    assert "`nnUNetTrainerDROLS` never did on 5 of 8 seeds, and `nnUNetTrainerDROLS_DRO` on 6 of 8" in methods
    late = {arm: sorted(int(e) for e in learned_by[arm].dropna()) for arm in ("DROLS", "DROLS_DRO")}
    assert late == {"DROLS": [102, 121, 143], "DROLS_DRO": [99, 110]}, late
    assert "it was late (epochs 102-143 and 99-110)" in methods
    assert "on 5 (`DROLS`), 6 (`_DRO`) and 3 (`_ceAscent`) of 8 seeds (ERM: none)" in page
    ce_unlearned = {int(s) for s in learned_by.index[learned_by["DROLS_ceAscent"].isna()]}
    assert ce_unlearned == {30, 31, 35} and "left deep grey matter unlearned on 3 of 8 seeds (30, 31, 35)" in methods
    assert "every structure learned on every seed: missed (3 of 8 not)" in methods


def test_erm_control_means_quoted_are_the_records():
    """ERM's own control means in the decision regime (not a gain, so not in the evidence table),
    on the larger test set and at the new centre, from the record's per-case files."""
    page = " ".join(EVIDENCE.read_text().split())
    assert "ERM's control means 97.1 / 91.7 / 95.0" in page and "ERM's control means fall to 88.9 / 65.8 / 79.7" in page
    kept = set(SCRIPT.learned_seeds(pd.read_csv(RECORDS / "decision40_24_200" / "runs.csv")))
    for cases, means in (("large_test", (97.1, 91.7, 95.0)), ("shifted_test", (88.9, 65.8, 79.7))):
        cases_table = pd.read_csv(RECORDS / "decision40_24_200" / SCRIPT.PER_CASE[cases])
        erm = cases_table[(cases_table.metric == "dice") & (cases_table.method == "ERM")
                          & (cases_table.condition == "control") & cases_table.seed.isin(kept)]
        by_region = erm.groupby("region")["value"].mean()
        assert tuple(round(by_region[r], 1) for r in ("white_matter", "intra_axial_csf", "cerebellum")) == means


def test_readme_stays_at_nnunets_size():
    assert len(README.read_text().splitlines()) <= 80
    assert len(EVIDENCE.read_text().splitlines()) <= 250


def table_rows(lines: list[str], header_start: str) -> dict[str, dict[str, str]]:
    """The markdown table whose header begins with ``header_start``: first cell -> {column: cell}."""
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = {}
            for table_row in lines[i + 2:]:
                if not table_row.startswith("|"):
                    break
                cells = [c.strip() for c in table_row.strip().strip("|").split("|")]
                rows[cells[0]] = dict(zip(header, cells))
            return rows
    raise AssertionError(f"no table starting with {header_start!r}")


def test_evidence_gpu_table_is_the_recorded_gpu_check():
    """The GPU cost table of docs/evidence.md is the recorded gpu_check.json of the H200 run."""
    record = json.loads((RECORDS / "gpu_check_h200" / "gpu_check.json").read_text())
    assert record["device"] == "NVIDIA H200"
    timing = record["timing"]
    page = table_rows(EVIDENCE.read_text().splitlines(), "| trainer | median of paired ratios")
    assert page["`nnUNetTrainer`"]["median of paired ratios to nnU-Net (IQR)"] == \
        f"{1e3 * timing['median_seconds']['nnUNetTrainer']:.1f} ms per iteration"
    for name, entry in timing["ratios"].items():
        cells = page[f"`{name}`"]
        q1, q3 = entry["paired_ratio_iqr"]
        assert cells["median of paired ratios to nnU-Net (IQR)"] == \
            f"{entry['median_paired_ratio']:.3f} ({q1:.3f}-{q3:.3f})", name
        assert cells["ratio of medians"] == f"{entry['ratio_of_medians']:.3f}", name
        assert cells["epoch end, per 250 iterations"] == \
            f"+{1e3 * entry['epoch_end_seconds']:.0f} ms ({entry['epoch_end_ratio_250_iterations']:.3f} x)", name


def test_issue_78_rule_on_the_decision_regime_is_a_secondary_reading(stored, capsys):
    """Issue 78's rule (nnunet_dro.lab.decision_rule) on the decision regime's 8 counting seeds, which
    had been read before it was written: no single-training arm is eligible (each lowers a control
    mean's lower bound below -1; the default's primary gain also fails Holm), the default stays, and
    JTT's paired lead over the default holds 0. The same with the GI-LS arms in Holm's family. The
    paired gains the rule reads are the stored table's, seed by seed."""
    verdict, rule = SCRIPT.rule_verdict()
    arms = verdict.arms.set_index("method")
    assert verdict.default == "DROAdaptive" and verdict.nothing_shown and not verdict.jtt_recommended
    assert not arms["eligible"].any() and not arms["controls_noninferior"].any()
    assert arms.loc["DROAdaptive", "worst_control"] == "control cerebellum mean"  # the one docs/evidence.md quotes
    assert set(arms.index[arms["primary_above_0"]]) == {"JTT", "DROAdaptive_f25_ermPhase"}
    assert tuple(round(x, 1) for x in verdict.jtt_minus_default[:3]) == (5.6, -2.8, 13.9)
    assert verdict.jtt_minus_default[3] == 8
    # every arm of the record but any still coming in (none since issue 79's were read, December 7, 22:30)
    everything = tuple(sorted(set(SCRIPT.record_gains("decision40_24_200")["method"])
                              - set(SCRIPT.HELD_BACK.get("decision40_24_200", ()))))
    wide, _ = SCRIPT.rule_verdict(arms=everything)
    assert len(wide.arms) == 10 and wide.nothing_shown and not wide.jtt_recommended
    gains = SCRIPT.record_gains("decision40_24_200")
    for method in arms.index:
        for statistic in STATISTICS:
            per_seed = gains[(gains.method == method) & (gains.statistic == statistic)].set_index("seed")["gain"]
            cell_row = row(stored, SCRIPT.DECISION["record"], method, statistic)
            assert [int(s) for s in cell_row["seed_list"].split()] == per_seed.index.tolist()
            assert cell_row["gain_per_seed"] == " ".join(f"{g:+.1f}" for g in per_seed)
    assert SCRIPT.main(["--decision"]) == 0
    out = capsys.readouterr().out
    assert "a secondary reading" in out and "nothing single-training is shown to help" in out
    assert "<= +8 needs 16 seeds" in out
    assert SCRIPT.main(["--decision", "decision40_24_120"]) == 2
    assert "no rule is set for record 'decision40_24_120'" in capsys.readouterr().err
    # the journal's pre-registration quotes these figures (written before any converged run)
    journal = " ".join((RECORDS / "journal.md").read_text().split())
    holm_p = {m: round(p, 2) for m, p in arms["holm_p"].items()}
    bounds = {m: round(b, 1) for m, b in arms["lowest_control_bound"].items()}
    assert f"adjusted p {holm_p['DROAdaptive']}; `_f25_ermPhase` {holm_p['DROAdaptive_f25_ermPhase']} and JTT " \
           f"{holm_p['JTT']} pass (a)" in journal
    assert f"the default {bounds['DROAdaptive']} on the cerebellum, `_f25_ermPhase` " \
           f"{bounds['DROAdaptive_f25_ermPhase']}, JTT {bounds['JTT']})" in journal
    assert "JTT - default +5.6 (-2.8 to 13.9) holds 0" in journal
    from nnunet_dro.lab.decision_rule import detectable_gain, seeds_needed
    sd = gains[(gains.statistic == "other intra_axial_csf p10") & gains.method.isin(SCRIPT.CARRIED_ARMS)].groupby(
        "method")["gain"].std()
    assert [round(sd[m], 1) for m in ("DROAdaptive", "JTT", "DROAdaptive_f25_ermPhase")] == [6.6, 7.4, 8.3]
    level = 0.05 / SCRIPT.CONVERGED_ARMS
    assert f"+{detectable_gain(8.3, 8, level):.1f} at 8 seeds and +{detectable_gain(8.3, 10, level):.1f} at 10" in journal
    assert seeds_needed(8.3, SCRIPT.CONVERGED_ARMS) == 16 and seeds_needed(6.6, SCRIPT.CONVERGED_ARMS) == 12
    assert "So the design is **16 fresh seeds**" in journal and "(12 with sd 6.6)" in journal



def test_issue_79_secondary_reading(stored):
    """Issue 79's secondary reading (journal, December 7, 20:10, fixed before its last six seeds): the
    December 5 family plus its two arms, seven in Holm's family, every one but JTT one training, on the
    decision regime's record; and its figures as the journal's 22:30 entry quotes them, with the error
    sets' "other" cases per counting seed (``error_sets.csv``)."""
    family, rule = SCRIPT.RULES["decision40_24_200_issue79"]
    five, december_5 = SCRIPT.RULES["decision40_24_200"]
    assert family == five + ("DROAdaptive_errorSet", "DROAdaptive_errorSet_refresh70") and len(family) == 7
    assert set(rule.single_training) == set(family) - {"JTT"} and rule.primary == december_5.primary
    assert SCRIPT.READINGS["decision40_24_200_issue79"] == "decision40_24_200"
    # the reading (journal, December 7, 22:30), figures as the journal quotes them
    verdict, _ = SCRIPT.rule_verdict("decision40_24_200_issue79")
    arms = verdict.arms.set_index("method")
    assert verdict.nothing_shown and not verdict.jtt_recommended and not arms["eligible"].any()
    journal = " ".join((RECORDS / "journal.md").read_text().split())
    for method, name in (("DROAdaptive_errorSet", "`DROAdaptive_errorSet`"), ("DROAdaptive_errorSet_refresh70", "`_refresh70`")):
        r = arms.loc[method]
        assert f"{name} **{r['gain']:+.1f} ({r['ci_low']:.1f} to {r['ci_high']:.1f})**" in journal
        assert not r["primary_above_0"] and not r["controls_noninferior"]
    assert round(arms.loc["JTT", "holm_p"], 2) == 0.02 and arms.loc["JTT", "primary_above_0"]
    assert (round(arms.loc["DROAdaptive_errorSet", "lowest_control_bound"], 2),
            round(arms.loc["DROAdaptive_errorSet_refresh70", "lowest_control_bound"], 2)) == (-1.70, -1.13)
    sets = pd.read_csv(RECORDS / "decision40_24_200" / "error_sets.csv")
    kept, _ = SCRIPT.counting_seeds("decision40_24_200")
    sets = sets[sets["seed"].isin(kept)]
    other = {(a, c): sets[(sets.arm == a) & (sets.choice == c)]["in_set_other"].tolist()
             for a, c in (("DROAdaptive_errorSet", 1), ("DROAdaptive_errorSet_refresh70", 1),
                          ("DROAdaptive_errorSet_refresh70", 2), ("JTT", 1))}
    assert other[("DROAdaptive_errorSet", 1)] == [1, 1, 2, 1, 2, 1, 3, 0] and other[("JTT", 1)] == [3] * 8
    assert other[("DROAdaptive_errorSet_refresh70", 1)] == [1, 1, 0, 1, 2, 2, 2, 2]
    assert other[("DROAdaptive_errorSet_refresh70", 2)] == [1, 0, 1, 1, 1, 1, 1, 0]


def test_a_reading_of_arms_still_held_back_is_refused(monkeypatch, capsys):
    """While a record holds arms back (their seeds still coming in), ``--decision`` on a family with
    them prints nothing of the reading: one line naming them, exit 2."""
    monkeypatch.setitem(SCRIPT.HELD_BACK, "decision40_24_200", ("DROAdaptive_errorSet", "DROAdaptive_errorSet_refresh70"))
    assert SCRIPT.main(["--decision", "decision40_24_200_issue79"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        "error: --decision: DROAdaptive_errorSet, DROAdaptive_errorSet_refresh70 on decision40_24_200 are held back "
        "until every counting seed has them (HELD_BACK in scripts/evidence_intervals.py)")


def test_readme_bottom_line_is_the_rules(stored):
    """The README's bottom line is the sentence ``evidence_intervals.py --bottom-line`` makes from issue
    78's rule and the stored cells, what it says of the default holds, and docs/choosing-robustness.md
    gives the same advice."""
    readme = " ".join(README.read_text().split())
    assert SCRIPT.bottom_line(stored) in readme
    verdict, _ = SCRIPT.rule_verdict()
    assert verdict.nothing_shown and not verdict.jtt_recommended and "use nnU-Net itself (ERM)" in readme
    default = verdict.arms.set_index("method").loc["DROAdaptive"]
    assert not default["primary_above_0"] and default["ci_low"] > 0  # above 0 alone, not after Holm
    cerebellum = row(stored, SCRIPT.DECISION["record"], "DROAdaptive", "control cerebellum mean")
    assert not claims.holds("within 1", cerebellum)
    advice = readme.split("**Bottom line:** ")[1].split(":")[0]
    choosing = " ".join(CHOOSING.read_text().split())
    assert f"**The bottom line** (the README's): {advice}." in choosing


def _converged_record(folder: Path, seeds: range, hd95_gain: float) -> None:
    """A hand-made converged record: every arm of the converged family and ERM twice on ``seeds``;
    each arm lifts the rare group's p10 by a seed-dependent amount and lowers its HD95 p90 by
    ``hd95_gain``; seed 52's second ERM run fails the exclusion test and seed 53's has no verdict."""
    rng = np.random.default_rng(0)
    rows, hd95 = [], []
    arms = ("ERM", "ERM_repeat") + SCRIPT.CONVERGED_FAMILY
    for seed in seeds:
        for arm in arms:
            lift = 0.0 if arm.startswith("ERM") else 3.0 + seed % 3
            for group, region in [("control", r) for r in ("white_matter", "intra_axial_csf", "cerebellum")] + [
                    ("other", "intra_axial_csf"), ("spina_bifida", "cerebellum")]:
                values = rng.uniform(80, 90, 20) + (lift if group != "control" else 0.0)
                rows += [{"method": arm, "case": f"c{i}", "region": region, "metric": "dice", "value": v,
                          "condition": group, "seed": seed} for i, v in enumerate(values)]
            hd95.append({"seed": seed, "method": arm, "group": "other", "region": "intra_axial_csf", "n": 20,
                         "mean": 2.0, "median": 1.5, "p90": 4.0 - (0.0 if arm.startswith("ERM") else hd95_gain)})
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "per_case_large_test.csv", index=False)
    pd.DataFrame(hd95).to_csv(folder / "hd95_large_test.csv", index=False)
    checks = [{"seed": s, "arm": a, "passed": not (s == 52 and a == "ERM_repeat")} for s in seeds
              for a in ("ERM", "ERM_repeat") if not (s == 53 and a == "ERM_repeat")]
    pd.DataFrame(checks).to_csv(folder / "calibration_checks.csv", index=False)


def test_the_converged_decision_counts_the_stored_exclusion_test_and_reports_hd95_beside(tmp_path, monkeypatch,
                                                                                           capsys):
    """On a converged record the rule counts only the seeds whose two ERM runs both passed the
    stored exclusion test (never the test cases), and reports the secondaries beside the verdict:
    the HD95 worst tenth as ERM's 90th percentile minus the arm's (lower is better)."""
    _converged_record(tmp_path / "converged2d_125_1600", range(50, 62), hd95_gain=0.5)
    monkeypatch.setattr(SCRIPT, "RECORD", tmp_path)
    kept, excluded = SCRIPT.counting_seeds("converged2d_125_1600")
    assert kept == [50, 51] + list(range(54, 62))
    assert excluded == {52: "ERM_repeat failed the test", 53: "ERM_repeat has no stored verdict"}
    gains = SCRIPT.record_gains("converged2d_125_1600")
    assert sorted(set(gains["seed"])) == kept
    hd95 = SCRIPT.hd95_gains("converged2d_125_1600")
    assert np.allclose(hd95["gain"], 0.5) and set(hd95["method"]) == set(SCRIPT.CONVERGED_FAMILY)
    secondary = SCRIPT.secondary_table("converged2d_125_1600", SCRIPT.CONVERGED_FAMILY).set_index(
        ["statistic", "method"])
    assert secondary.loc[("other intra_axial_csf HD95 p90", "JTT"), "gain"] == 0.5
    assert (secondary["seeds"] == 10).all()
    assert SCRIPT.main(["--decision", "converged2d_125_1600"]) == 0
    out = capsys.readouterr().out
    assert "counting seeds (10): 50 51 54" in out and "seed 52 excluded: ERM_repeat failed the test" in out
    assert "secondary statistics (reported beside, never used to pick" in out
    assert "other intra_axial_csf HD95 p90" in out and "a secondary reading" not in out
