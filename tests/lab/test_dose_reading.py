"""``scripts/evidence_intervals.py --dose`` on hand-made records: the dose-response's registered
reading (journal, December 6: holds / shrinks / vanishes on the primary, controls within 1 point,
4x only where ERM's rare training cases still rise over the last quarter at 2x; December 7, 17:58:
4x is the last rung, read against 1x in the same way, and truncated there if ERM still rises)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.errors import UserError
from script_modules import load_script

SEEDS = (30, 31, 32, 34)
REGIONS = ("white_matter", "intra_axial_csf", "cerebellum")


SCRIPT = load_script("evidence_intervals")


def _per_case(shift: dict[tuple[str, str, str], float]) -> pd.DataFrame:
    """Ten cases per group; every Dice 80 (90 for controls) plus ``shift[(method, group, region)]``
    on every case, so a p10 or mean moves by exactly that shift."""
    rows = []
    for method in ("ERM", "ERM_repeat", "DROAdaptive", "JTT"):
        for seed in SEEDS:
            for group in ("control", "spina_bifida", "other"):
                for case in range(10):
                    for region in REGIONS:
                        base = 90.0 if group == "control" else 80.0
                        value = base + shift.get((method, group, region), 0.0) + (seed - 30) * 0.1
                        rows.append({"method": method, "case": f"{group}_{case}", "region": region, "metric": "dice",
                                     "value": value, "condition": group, "seed": seed})
    return pd.DataFrame(rows)


def _fit(record: Path, epochs: int | None, rise: float) -> None:
    """The 1x record's end-of-training fit; a later budget's curve (networks at 1/2, 3/4 and the end of
    ``epochs``) whose ERM run on seed 34 rises by ``rise`` over the last quarter (the others by 0.2)."""
    if epochs is None:
        rows = [{"method": m, "seed": s, "group": "other", "region": "intra_axial_csf", "n_training": 3,
                 "training_mean": 70.0, "training_p10": 65.0, "test_mean": 68.0, "test_p10": 60.0}
                for m in ("ERM", "ERM_repeat", "DROAdaptive", "JTT") for s in SEEDS]
        pd.DataFrame(rows).to_csv(record / "training_fit.csv", index=False)
        return
    half, three_quarters = epochs // 2, 3 * epochs // 4
    curve = [{"method": m, "seed": s, "epoch": e, "group": "other", "region": "intra_axial_csf", "n": 3,
              "mean": {half: 75.0, three_quarters: 80.0, epochs: 80.0 + (rise if s == 34 else 0.2)}[e], "p10": 60.0}
             for m in ("ERM", "DROAdaptive", "JTT") for s in SEEDS for e in (half, three_quarters, epochs)]
    pd.DataFrame(curve).to_csv(record / "training_fit_curve.csv", index=False)


def _record(folder: Path, gain: float, control: float, epochs: int | None, rise: float) -> None:
    folder.mkdir()
    shift = {("DROAdaptive", "other", "intra_axial_csf"): gain, ("JTT", "other", "intra_axial_csf"): 2 * gain,
             ("DROAdaptive", "control", "cerebellum"): control}
    table = _per_case(shift)
    if epochs is not None:  # one ERM run at a later budget, as the dose-response trains
        table = table[table["method"] != "ERM_repeat"]
    table.to_csv(folder / "per_case_large_test.csv", index=False)
    _fit(folder, epochs, rise)


def _records(tmp_path: Path, gain_1x: float, gain_2x: float, control_2x: float = 0.0, rise: float = 0.3) -> Path:
    _record(tmp_path / "r1", gain_1x, 0.0, None, 0.0)
    _record(tmp_path / "r2", gain_2x, control_2x, 400, rise)
    return tmp_path


DOSE = {"records": {"1x": "r1", "2x": "r2", "4x": "r4"}, "seeds": SEEDS, "arms": ("DROAdaptive", "JTT"),
        "epochs": {"2x": 400, "4x": 800}}


@pytest.mark.parametrize("gain_1x, gain_2x, reading", [
    (10.0, 6.0, "holds"), (10.0, 5.0, "holds"), (10.0, 4.0, "shrinks"), (10.0, 0.0, "vanishes"),
    (10.0, -3.0, "vanishes"), (0.0, 5.0, "no gain at 1x")])
def test_the_primary_is_read_by_the_registered_rule(tmp_path, gain_1x, gain_2x, reading):
    table = SCRIPT.dose_table(_records(tmp_path, gain_1x, gain_2x), DOSE)
    row = table[(table["method"] == "DROAdaptive") & (table["statistic"] == SCRIPT.PRIMARY)].iloc[0]
    assert row["reading_2x"] == reading and "reading_4x" not in table  # no 4x record: 1x and 2x only
    assert row["mean_1x"] == pytest.approx(gain_1x) and row["mean_2x"] == pytest.approx(gain_2x)
    assert row["gain_per_seed_2x"] == " ".join([f"{gain_2x:+.1f}"] * 4)


@pytest.mark.parametrize("cost, words", [(-0.9, "within 1 point at 2x"), (-1.0, "costs 1 point or more at 2x")])
def test_a_control_cost_is_read_against_one_point(tmp_path, cost, words):
    table = SCRIPT.dose_table(_records(tmp_path, 10.0, 6.0, control_2x=cost), DOSE)
    row = table[(table["method"] == "DROAdaptive") & (table["statistic"] == "control cerebellum mean")].iloc[0]
    assert row["reading_2x"] == words and row["mean_2x"] == pytest.approx(cost)


@pytest.mark.parametrize("rise, four", [(0.99, "4x is not needed"), (1.0, "4x is to be trained")])
def test_4x_is_asked_for_only_where_an_erm_run_still_rises(tmp_path, rise, four):
    lines = SCRIPT.dose_lines(_records(tmp_path, 10.0, 6.0, rise=rise), DOSE)
    assert lines[-1].startswith(four)
    assert lines[-1].endswith("34") == (rise >= 1.0)
    fit = SCRIPT.dose_fit_table(tmp_path, DOSE)
    erm = fit[(fit["method"] == "ERM") & (fit["seed"] == 34)].iloc[0]
    assert erm["fit_1x_end"] == 70.0 and erm["fit_2x_epoch_300"] == 80.0
    assert erm["rise_last_quarter_2x"] == pytest.approx(rise)
    assert np.isnan(fit[fit["method"] == "ERM_repeat"]["rise_last_quarter_2x"]).all()  # no 2x run of it


def test_a_seed_missing_at_one_budget_is_an_error_naming_it(tmp_path):
    records = _records(tmp_path, 10.0, 6.0)
    table = pd.read_csv(records / "r2" / "per_case_large_test.csv")
    table[~((table["method"] == "JTT") & (table["seed"] == 32))].to_csv(records / "r2" / "per_case_large_test.csv",
                                                                        index=False)
    with pytest.raises(UserError, match=r"r2 has no JTT run on seed\(s\) \[32\]"):
        SCRIPT.dose_table(records, DOSE)


@pytest.mark.parametrize("gain_4x, rise, reading, last", [
    (6.0, 0.99, "holds", "ERM has plateaued at 4x"), (3.0, 1.0, "shrinks", "the dose-response is truncated at 4x"),
    (-1.0, 0.2, "vanishes", "ERM has plateaued at 4x")])
def test_4x_is_read_against_1x_and_is_the_last_rung(tmp_path, gain_4x, rise, reading, last):
    """Once the 4x record exists it is read like 2x, against 1x; its ERM curve's last quarter (epochs
    600-800) says whether ERM plateaued there, and if not the reading is truncated at 4x (no 8x)."""
    records = _records(tmp_path, 10.0, 6.0, rise=1.5)
    _record(records / "r4", gain_4x, 0.0, 800, rise)
    table = SCRIPT.dose_table(records, DOSE)
    row = table[(table["method"] == "DROAdaptive") & (table["statistic"] == SCRIPT.PRIMARY)].iloc[0]
    assert (row["reading_2x"], row["reading_4x"]) == ("holds", reading)
    assert row["mean_4x"] == pytest.approx(gain_4x)
    lines = SCRIPT.dose_lines(records, DOSE)
    assert lines[-1].startswith(last) and lines[-1].endswith("34") == (rise >= 1.0)
    assert f"DROAdaptive: the primary gain holds at 2x, {reading} at 4x (+10.0 at 1x, +6.0 at 2x, {gain_4x:+.1f} at 4x)" \
        in lines
    fit = SCRIPT.dose_fit_table(records, DOSE)
    erm = fit[(fit["method"] == "ERM") & (fit["seed"] == 34)].iloc[0]
    assert erm["rise_last_quarter_2x"] == pytest.approx(1.5) and erm["rise_last_quarter_4x"] == pytest.approx(rise)
    assert erm["fit_4x_epoch_600"] == 80.0


def test_a_4x_record_still_coming_in_is_not_read(tmp_path):
    """While the 4x round runs its record lacks seeds: the reading refuses, naming them, rather than
    reading part of it."""
    records = _records(tmp_path, 10.0, 6.0)
    _record(records / "r4", 4.0, 0.0, 800, 0.2)
    table = pd.read_csv(records / "r4" / "per_case_large_test.csv")
    table[table["seed"].isin((30, 31))].to_csv(records / "r4" / "per_case_large_test.csv", index=False)
    with pytest.raises(UserError, match=r"r4 has no ERM run on seed\(s\) \[32, 34\]"):
        SCRIPT.dose_lines(records, DOSE)
