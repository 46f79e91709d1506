"""Stratified robustness evaluation of segmentation predictions (``nnunet_dro evaluate``).

Per case and region: Dice, volume similarity and NSD in percent, HD95 in mm, topology errors
(Euler characteristic, Betti numbers); per subgroup: mean, std, median, IQR, worst-tail
percentiles and CVaR10 by each metric's direction (the tail is what robustness is about); the
gap between the best and the worst subgroup; paired comparisons between methods. Imports nothing from :mod:`nnunet_dro.training` or :mod:`nnunet_dro.sampling`.

Modules: :mod:`~.regions` (presets, parsing), :mod:`~.io` (files, geometry),
:mod:`~.metrics` (confusion tables, Dice/VS/HD95), :mod:`~.groups` (subgroup table, binning),
:mod:`~.stats` (statistics, tests), :mod:`~.disparity` (gap between groups), :mod:`~.result` (``EvaluationResult``), :mod:`~.reports`
(writers), :mod:`~.workers` (process pool), :mod:`~.options` (``EvaluationOptions``, every option of
``evaluate`` as one object), :mod:`~.api` (``evaluate``). Imports go one way: ``api`` uses ``reports``
and ``options``, both use ``result``.
"""
__all__ = ["evaluate", "EvaluationOptions", "EvaluationResult"]


def __getattr__(name):
    # Lazy: worker processes import only the metrics module, not pandas and the report writers.
    if name == "EvaluationOptions":
        from nnunet_dro.evaluation import options
        return options.EvaluationOptions
    if name in __all__:
        from nnunet_dro.evaluation import api
        return getattr(api, name)
    raise AttributeError(name)
