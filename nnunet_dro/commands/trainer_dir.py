"""``nnunet_dro trainer-dir``: print the folder to put in ``nnUNet_extTrainer``.

    export nnUNet_extTrainer=$(nnunet_dro trainer-dir)
    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerDRO

To keep trainers of your own as well, join the folders with ``os.pathsep`` (``:`` on Linux):
``export nnUNet_extTrainer=$(nnunet_dro trainer-dir):/path/to/my_trainers``.
"""
from __future__ import annotations

import argparse

from nnunet_dro.ext_trainers import TRAINER_DIR


def run(args: argparse.Namespace) -> int:
    print(TRAINER_DIR)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "trainer-dir",
        help="print the folder of nnUNetTrainerDRO modules for nnU-Net's nnUNet_extTrainer",
        description="Print the folder holding the nnunet_dro trainer modules. Use it as "
                    "`export nnUNet_extTrainer=$(nnunet_dro trainer-dir)` so that "
                    "`nnUNetv2_train ... -tr nnUNetTrainerDRO` (and nnUNetv2_predict) find the trainers.")
    parser.set_defaults(func=run)
