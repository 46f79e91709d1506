"""The lab: what measures the method, beside the product a user runs.

- :mod:`nnunet_dro.lab.budget`: the CPU-budget twin ``<Trainer>_CPUBudget`` of every trainer (a
  narrower network and a short budget a 2-core CPU can afford), and the benchmark's arm names;
- :mod:`nnunet_dro.lab.ext_trainers`: the folder that puts those twins on nnU-Net's
  ``nnUNet_extTrainer`` path, beside the product's (:func:`~nnunet_dro.lab.ext_trainers.lab_trainer_dirs`);
- :mod:`nnunet_dro.lab.pipeline`: cohort -> plan -> train arms -> predict -> evaluate, in one
  working folder, composed of :mod:`~nnunet_dro.lab.cohort_folder` (the cohort, its label noise,
  :mod:`~nnunet_dro.lab.label_noise`, and the audit's exclusion, nnU-Net's preprocessing),
  :mod:`~nnunet_dro.lab.arm_runs` (each arm trained, predicted, scored, stored; what a run tells:
  :mod:`~nnunet_dro.lab.run_summary`) and :mod:`~nnunet_dro.lab.draw_statistics`;
  :mod:`nnunet_dro.lab.benchmark` and :mod:`nnunet_dro.lab.benchmark_analysis`: the robustness
  benchmark's runner and report; :mod:`nnunet_dro.lab.demo`: ``nnunet_dro demo``;
- :mod:`nnunet_dro.lab.experiments`: the digits toy experiment.

The lab imports the product (:mod:`nnunet_dro.training`, :mod:`nnunet_dro.evaluation`,
:mod:`nnunet_dro.workflows`, ...), never the reverse: ``tests/test_layers.py`` says so; the only
product module that reaches in is the ``nnunet_dro demo`` command, at run time. The lab is not in
the wheel (setup.py ``LAB_PACKAGES``): it imports from a source checkout (``pip install -e .``).
"""
