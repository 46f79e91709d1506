"""nnunet_dro: distributionally robust training and robustness evaluation for nnU-Net v2.

Layers (each imports only the ones above it):

- :mod:`nnunet_dro.sampling`: the hardness weighted sampler (pure numpy, no nnU-Net import).
- :mod:`nnunet_dro.training`: nnU-Net trainers that wire the sampler into ``nnUNetv2_train``.
- :mod:`nnunet_dro.evaluation`: stratified robustness evaluation of prediction folders.
- :mod:`nnunet_dro.data`: dataset converters and synthetic cohorts.
- :mod:`nnunet_dro.workflows`: ensembling and the demo, composed of the above and nnU-Net's CLIs.
"""

__version__ = "0.1.0"
