"""What ``nnunet_dro audit-labels`` finds on the robustness benchmark's noisy cohorts.

Generates the benchmark's synthetic fetal cohort of each seed (177 training and 60 test cases of
32^3, as ``scripts/benchmark_robustness.py`` makes them), corrupts the labels of ``--label-noise``
training cases exactly as the benchmark's ``--label-noise`` does (same seed, same cases), runs the
audit on ``labelsTr`` with its default settings, once over the whole cohort and once within each
condition (``-groups subgroups.tsv --group-by condition``), and prints, summed over the seeds, how
many cases of each kind of corruption and how many clean cases of each group were flagged.
Nothing is trained; a seed takes seconds::

    python scripts/benchmark_label_audit.py --seeds 13,14,15,16,17,18,19,20 --label-noise 8
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from nnunet_dro.data.label_audit import audit_volumes, dataset_labels, label_volumes
from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.subgroups import read_subgroups
from nnunet_dro.data.synthetic_common import CohortSpec
from nnunet_dro.data.synthetic_fetal import make_fetal_dataset
from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MINORITY_GROUPS, Cohort
from nnunet_dro.lab.label_noise import corrupt_training_labels


def audit_seed(seed: int, label_noise: int, root: Path) -> pd.DataFrame:
    """One row per training case: its group, its corruption ('clean' if none) and its flags over
    the whole cohort (``flags``) and within its condition (``flags_within``)."""
    os.environ["nnUNet_raw"] = str(root / f"seed_{seed}")
    cohort = Cohort(seed=seed, label_noise=label_noise)
    raw = make_fetal_dataset(DatasetTarget(993, "LabelAudit"),
                             CohortSpec(n_train=cohort.n_train, n_test=cohort.n_test, size=cohort.size, seed=seed))
    groups = read_subgroups(raw / "subgroups.tsv")
    train = groups[groups["split"] == "train"]
    noise = corrupt_training_labels(raw / "labelsTr", dict(zip(train["case"], train[GROUP_COLUMN])), label_noise,
                                    MINORITY_GROUPS, seed, root / f"label_noise_{seed}.json")
    volumes = label_volumes(raw / "labelsTr", dataset_labels(raw / "dataset.json"), num_processes=2)
    kinds = {row["case"]: row["kind"] for row in noise}
    out = pd.DataFrame({"seed": seed, "case": train["case"], "group": train[GROUP_COLUMN],
                        "corruption": train["case"].map(kinds).fillna("clean")})
    for column, groups in (("flags", None), ("flags_within", train.set_index("case")[GROUP_COLUMN])):
        flags = audit_volumes(volumes, groups=groups)
        flagged = flags.groupby("case")["flag"].apply(lambda f: ",".join(sorted(set(f))))
        out[column] = out["case"].map(flagged).fillna("")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="13,14,15,16,17,18,19,20",
                        help="comma-separated cohort seeds. Default: 13-20 (13-15: the benchmark's noisy cohorts)")
    parser.add_argument("--label-noise", type=int, default=8, help="corrupted training cases. Default: 8")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        cases = pd.concat([audit_seed(seed, args.label_noise, Path(tmp)) for seed in seeds], ignore_index=True)
    for column in ("flags", "flags_within"):
        cases[f"{column}_any"] = cases[column] != ""
        cases[f"{column}_missing"] = cases[column].str.contains("missing")
    summary = {"flagged (cohort)": ("flags_any", "sum"), "as missing (cohort)": ("flags_missing", "sum"),
               "flagged (within condition)": ("flags_within_any", "sum"),
               "as missing (within condition)": ("flags_within_missing", "sum")}
    noisy = cases[cases["corruption"] != "clean"].groupby("corruption").agg(cases=("case", "size"), **summary)
    clean = cases[cases["corruption"] == "clean"].groupby("group").agg(cases=("case", "size"), **summary)
    print(f"Seeds {', '.join(map(str, seeds))}, {args.label_noise} corrupted training cases each; audit defaults.")
    print("\nCorrupted training cases flagged:")
    print(noisy.to_string())
    print("\nClean training cases flagged (false alarms, or a group's real anatomy):")
    print(clean.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
