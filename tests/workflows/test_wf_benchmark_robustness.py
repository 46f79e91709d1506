"""scripts/benchmark_robustness.py: seed parsing, the statistics it aggregates over seeds, and the
pairing it relies on (ERM and DRO of one repetition start from the same initial weights).

The whole benchmark is not run here (minutes of nnU-Net training); the lead's demo test covers the
chain make-synthetic -> plan -> train -> predict -> evaluate that the benchmark repeats per seed.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.workflows.demo import DemoBudget, trainer_names, write_budget_trainers

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_robustness.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_robustness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text, expected", [
    ("3", [0, 1, 2]),
    ("1", [0]),
    ("4,7,9", [4, 7, 9]),
    ("5,", [5]),
])
def test_parse_seeds(bench, text, expected):
    assert bench.parse_seeds(text) == expected


@pytest.mark.parametrize("text", ["0", "abc", "1,1", "-1,2", "2.5", ","])
def test_parse_seeds_rejects(bench, text):
    with pytest.raises(UserError, match="--seeds"):
        bench.parse_seeds(text)


def _per_case(shift_minority_low: float, seeds=(0, 1, 2)) -> pd.DataFrame:
    """10 control and 10 spina-bifida cases per seed, one region. DRO adds ``shift_minority_low``
    to the three worst spina-bifida cases of every seed and leaves everything else as ERM."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for group, centre in (("control", 90.0), ("spina_bifida", 60.0)):
            values = np.sort(rng.normal(centre, 8.0, 10))
            for k, value in enumerate(values):
                case = f"{group}_{seed}_{k}"
                dro = value + (shift_minority_low if group == "spina_bifida" and k < 3 else 0.0)
                rows.append(dict(seed=seed, method="ERM", case=case, region="cerebellum", metric="dice",
                                 value=value, condition=group))
                rows.append(dict(seed=seed, method="DRO", case=case, region="cerebellum", metric="dice",
                                 value=dro, condition=group))
    return pd.DataFrame(rows)


def test_statistics_match_numpy_per_seed_and_average_over_seeds(bench):
    per_case = _per_case(5.0)
    by_seed = bench.summary_by_seed(per_case)
    one = per_case[(per_case.seed == 1) & (per_case.method == "ERM") & (per_case.condition == "spina_bifida")]
    row = by_seed.query("seed == 1 and method == 'ERM' and group == 'spina_bifida'").iloc[0]
    values = one["value"].to_numpy()
    assert row["n"] == 10
    assert row["p10"] == pytest.approx(np.percentile(values, 10))
    assert row["iqr"] == pytest.approx(np.percentile(values, 75) - np.percentile(values, 25))
    assert by_seed.query("group == 'all'")["n"].eq(20).all()

    summary = bench.summary_over_seeds(by_seed)
    row = summary.query("method == 'ERM' and group == 'spina_bifida'").iloc[0]
    per_seed = by_seed.query("method == 'ERM' and group == 'spina_bifida'")["p5"]
    assert row["n_seeds"] == 3
    assert row["p5"] == pytest.approx(per_seed.mean())
    assert row["p5_sd"] == pytest.approx(per_seed.std(ddof=1))


def test_paired_comparison_finds_raised_minority_tail_and_unchanged_controls(bench):
    per_case = _per_case(12.0)
    by_seed = bench.summary_by_seed(per_case)
    paired = bench.paired_comparison(per_case, by_seed).set_index("group")
    minority, control = paired.loc["spina_bifida"], paired.loc["control"]
    assert minority["d_p10"] > 0 and minority["d_p10_seeds_up"] == 3
    assert minority["d_p5"] > 0 and minority["d_p5_seeds_up"] == 3
    iqr = {m: [np.subtract(*np.percentile(f["value"], [75, 25])) for _, f in
               per_case.query("condition == 'spina_bifida' and method == @m").groupby("seed")] for m in ("DRO", "ERM")}
    assert minority["d_iqr"] == pytest.approx(np.mean(np.subtract(iqr["DRO"], iqr["ERM"])))
    assert minority["pooled_n"] == 30
    assert minority["pooled_mean"] == pytest.approx(12.0 * 9 / 30)
    assert minority["pooled_share_improved"] == pytest.approx(0.3)
    assert control["d_mean"] == 0 and control["d_p10_seeds_up"] == 0
    assert control["pooled_wilcoxon_p"] == 1.0  # all differences zero
    lines = bench.claim_check(paired.reset_index())
    assert any(line.startswith("spina_bifida / cerebellum: p10 +") and "raised in every seed" in line
               for line in lines)
    assert any(line.startswith("control / cerebellum: mean +0.0 points: unchanged") for line in lines)


def test_paired_comparison_reports_a_lowered_tail(bench):
    per_case = _per_case(-12.0)
    paired = bench.paired_comparison(per_case, bench.summary_by_seed(per_case)).set_index("group")
    assert paired.loc["spina_bifida", "d_p10"] < 0
    assert any("lowered in every seed" in line for line in bench.claim_check(paired.reset_index()))


def test_reports_render(bench):
    per_case = _per_case(3.0)
    by_seed = bench.summary_by_seed(per_case)
    summary = bench.summary_over_seeds(by_seed)
    paired = bench.paired_comparison(per_case, by_seed)
    settings = {"seeds": [0, 1, 2], "cohort": {"n_train": 40, "n_test": 30, "size": 32},
                "budget": {"epochs": 2, "iterations_per_epoch": 3}, "device": "cpu", "seconds": 1.0, "runs": "x"}
    text = bench.markdown_report(summary, paired, settings)
    assert "| spina_bifida | cerebellum | DRO |" in text and "Δp10" in text
    assert "spina_bifida" in bench.terminal_report(summary, paired)


def test_existing_run_folder_needs_keep_or_overwrite(bench, tmp_path):
    (tmp_path / "runs" / "seed_0").mkdir(parents=True)
    code = bench.main(["--seeds", "1", "-o", str(tmp_path)])
    assert code == 2


@pytest.mark.slow
def test_seeded_budget_trainers_start_from_the_same_weights(tmp_path):
    """The paired comparison assumes both arms of a repetition share their initial weights."""
    env = {**os.environ, "nnUNet_raw": str(tmp_path / "raw"), "nnUNet_preprocessed": str(tmp_path / "pre"),
           "nnUNet_results": str(tmp_path / "res"), "nnUNet_compile": "f", "nnUNet_def_n_proc": "1",
           "OMP_NUM_THREADS": "1"}
    bin_dir = Path(sys.executable).parent
    subprocess.run([sys.executable, "-m", "nnunet_dro", "make-synthetic", "--kind", "fetal", "-d", "993",
                    "--n-train", "3", "--n-test", "0", "--size", "16"], env=env, check=True, capture_output=True)
    subprocess.run([str(bin_dir / "nnUNetv2_plan_and_preprocess"), "-d", "993", "-c", "3d_fullres", "-np", "1",
                    "-npfp", "1"], env=env, check=True, capture_output=True)
    budget = DemoBudget(1, 1, 1)
    for seed, folder in ((7, tmp_path / "seeded"), (None, tmp_path / "unseeded")):
        write_budget_trainers(folder, budget, seed=seed)
    names = trainer_names(budget)
    check = textwrap.dedent(f"""
        import sys, torch
        from batchgenerators.utilities.file_and_folder_operations import join, load_json
        sys.path.insert(0, sys.argv[1])
        import nnunet_dro_demo_trainers as m
        folder = join({str(tmp_path / 'pre')!r}, 'Dataset993_SyntheticFetal')
        plans, dataset = load_json(join(folder, 'nnUNetPlans.json')), load_json(join(folder, 'dataset.json'))
        weights = []
        for name in ({names['ERM']!r}, {names['DRO']!r}):
            # nnU-Net 2.8's run_training sets this key before building a trainer
            trainer = getattr(m, name)({{**plans, 'continue_training': False}}, '3d_fullres', 0, dataset,
                                       device=torch.device('cpu'))
            trainer.initialize()
            weights.append(torch.cat([p.detach().flatten() for p in trainer.network.parameters()]))
        print('SAME' if torch.equal(*weights) else 'DIFFERENT', getattr(m.{names['DRO']}, 'dro_seed', None))
    """)
    outputs = {}
    for label in ("seeded", "unseeded"):
        done = subprocess.run([sys.executable, "-c", check, str(tmp_path / label)], env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[label] = done.stdout.strip().splitlines()[-1]
    assert outputs["seeded"] == "SAME 7"
    assert outputs["unseeded"] == "DIFFERENT None"
