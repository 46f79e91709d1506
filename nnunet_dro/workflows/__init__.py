"""Workflows: thin compositions of nnU-Net's own CLIs and of the evaluation (ensembling, demo)."""
