"""``nnunet_dro audit-labels``: flag training labels that may be wrong, before training.

Per structure and case: a structure missing where nearly every case has it, or a volume far
outside the cohort's (:mod:`nnunet_dro.data.label_audit`). Example::

    nnunet_dro audit-labels -d 201 -o label_audit.tsv      # or -i $nnUNet_raw/Dataset201_FeTA
    nnunet_dro audit-labels -d 201 -groups $nnUNet_raw/Dataset201_FeTA/subgroups.tsv \\
        --group-by condition     # fences within each condition: its real anatomy is not flagged
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nnunet_dro.commands.arg_types import fraction, positive_float, positive_int
from nnunet_dro.commands.dataset_options import add_input_dataset_argument, raw_dataset_folder


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit-labels", help="flag training labels that may be wrong (a structure missing, a volume far off)",
        description="Reads an nnU-Net raw dataset's labelsTr and flags, per structure and case, a structure "
                    "with no voxel while at least --presence of the other cases have it (missing), and a volume in mL "
                    "beyond --fence interquartile ranges of the cohort's log volumes (small, large). A wrong "
                    "label keeps a high loss, so hardness weighted sampling chases it; open the flagged cases "
                    "before training. Prints one line per flag; exit code 0 whether or not any is found.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    inputs = parser.add_mutually_exclusive_group(required=True)
    add_input_dataset_argument(inputs, "the dataset to audit")
    inputs.add_argument("-i", dest="dataset_dir", type=Path, default=None, metavar="DATASET_DIR",
                        help="or its raw dataset folder, e.g. $nnUNet_raw/Dataset201_FeTA (dataset.json, labelsTr)")
    parser.add_argument("-o", dest="output", type=Path, default=None, metavar="TABLE",
                        help="also write the flags as a table, tab-separated for .tsv, comma-separated for .csv, as "
                             "exclude-cases -table reads it (case, label, flag, volume_ml, median_ml, low_fence_ml, "
                             "high_fence_ml, group, judged_by)")
    parser.add_argument("-groups", default=None, metavar="TABLE",
                        help="subgroup table (.tsv or .csv, column 'case'): with --group-by, fences are taken "
                             "within each group, so that a group's real anatomy is not flagged, and a missing "
                             "structure is judged against the group and the cohort; a line per group says what it "
                             "can flag")
    parser.add_argument("--group-by", default=None, metavar="COL",
                        help="the column of -groups to audit within, e.g. condition")
    parser.add_argument("--labels", default="labelsTr", metavar="SUBFOLDER",
                        help="label folder inside DATASET_DIR. Default: labelsTr")
    parser.add_argument("--presence", type=fraction, default=0.9,
                        help="a structure absent from a case is flagged when at least this share of the other "
                             "cases have it. Default: 0.9")
    parser.add_argument("--fence", type=positive_float, default=3.0,
                        help="interquartile ranges of log volume beyond the quartiles that flag a volume "
                             "(Tukey's far out: 3). Default: 3")
    parser.add_argument("-np", dest="num_processes", type=positive_int, default=None, metavar="N",
                        help="processes reading cases. Default: nnUNet_def_n_proc or 8")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.atomic import write_text_atomic
    from nnunet_dro.data.label_audit import audit_volumes, dataset_labels, group_detection, label_volumes
    from nnunet_dro.errors import UserError
    from nnunet_dro.evaluation.api import default_num_processes
    from nnunet_dro.tables import case_table_text, check_table_output

    if args.output is not None:
        check_table_output(args.output)
    if args.dataset_dir is None:
        args.dataset_dir = raw_dataset_folder(args.dataset)
    if args.dataset_dir.is_file() or not args.dataset_dir.exists():
        raise UserError(f"-i {args.dataset_dir}: not a folder (expected an nnU-Net raw dataset folder)")
    dataset_json = args.dataset_dir / "dataset.json"
    if not dataset_json.is_file():
        raise UserError(f"{args.dataset_dir}: no dataset.json (expected an nnU-Net raw dataset folder)")
    labels = dataset_labels(dataset_json)
    file_ending = json.loads(dataset_json.read_text()).get("file_ending", ".nii.gz")
    processes = args.num_processes or default_num_processes()
    if (args.groups is None) != (args.group_by is None):
        raise UserError("-groups and --group-by go together: the table and the column to audit within")
    groups = None
    if args.groups is not None:
        from nnunet_dro.data.subgroups import read_subgroups

        table = read_subgroups(args.groups)
        if args.group_by not in table.columns:
            raise UserError(f"{args.groups}: no column {args.group_by!r} (columns: {', '.join(table.columns)})")
        groups = table.set_index("case")[args.group_by]
    volumes = label_volumes(args.dataset_dir / args.labels, labels, file_ending, processes,
                            progress=sys.stderr.isatty())  # bars in a terminal only
    try:
        flags = audit_volumes(volumes, presence=args.presence, fence=args.fence, groups=groups)
    except UserError as error:
        if groups is None:
            raise
        raise UserError(f"{args.groups}: {error}") from None
    if groups is not None:
        by_case = volumes["case"].map(groups)
        for group in sorted(by_case.unique(), key=str):
            members = volumes[by_case == group]
            print(f"group {group} ({len(members)} cases): {group_detection(len(members), args.presence)}",
                  file=sys.stderr)
            for label in labels:
                have = int((volumes[label] > 0).sum())
                if not (members[label] > 0).any() and len(members) > 1 and have:
                    print(f"note: group {group}: none of its {len(members)} cases has {label} (the cohort: {have} "
                          f"of {len(volumes)}): taken as the group's anatomy, not flagged; open them if it is not",
                          file=sys.stderr)
    for row in flags.itertuples():
        where = "cohort" if groups is None else f"{row.group}"
        print(f"{row.case}\t{row.label}\t{row.flag}\t{row.volume_ml:.3g} mL ({where} median {row.median_ml:.3g}; "
              f"judged by {row.judged_by})")
    print(f"{flags['case'].nunique()} of {len(volumes)} cases flagged ({len(flags)} flags) in "
          f"{args.dataset_dir / args.labels}")
    if args.output is not None:
        write_text_atomic(args.output, case_table_text(flags, args.output))
    return 0
