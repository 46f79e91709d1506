"""Subgroup discovery (``nnunet_dro discover``): hard groups of cases that no table names.

Per-case features (:mod:`~.features`: Dice/HD95 and their ranks, DRO hardness, reference and
predicted volumes, image intensity inside and around each region) are clustered with the error up-
weighted (:mod:`~.clustering`, a diagonal Gaussian mixture whose error features count several
times, as in slice discovery: Domino, Eyuboglu et al., ICLR 2022, arXiv 2203.14960); each candidate
group is described in words with its Dice tail against the rest (:mod:`~.description`) and written
as ``report.md``, ``groups.json`` and a ``subgroups.tsv`` that ``nnunet_dro evaluate -groups`` reads
(:mod:`~.report`). :mod:`~.api` ties them together. Imports the evaluation, the data layer and the
case-table reader; nothing of training or workflows.
"""
