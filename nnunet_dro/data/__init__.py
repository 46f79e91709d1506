"""Data preparation: converters (FeTA, BraTS 2019) and synthetic stratified cohorts.

Every function here writes an nnU-Net v2 raw dataset (``imagesTr``/``labelsTr``/``imagesTs``/
``labelsTs`` + ``dataset.json``) and a subgroup table ``subgroups.tsv`` beside ``dataset.json``.
See ``data_docs/`` for the dataset pages and the subgroup table format.
"""
