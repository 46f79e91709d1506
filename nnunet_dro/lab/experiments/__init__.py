"""Small, self-contained experiments that give evidence about the method (no nnU-Net import).

- :mod:`nnunet_dro.lab.experiments.digits`: the paper's class-imbalance toy (section 4.1) on
  scikit-learn's bundled 8x8 handwritten digits, comparing ERM, hardness weighted sampling and
  the related methods of docs/methods.md (chi-square DRO sampling, KL reweighting, learning
  to reweight) in one table; driven by ``scripts/digits_imbalance.py``.
"""
