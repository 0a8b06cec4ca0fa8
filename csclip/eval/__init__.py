"""Evaluation: the half-truth benchmark (halftruth/), compositional suites (suites/),
retrieval, zero-shot classification, one encoder with its feature cache per model
(encoder.py), reports (report.py) and the pipeline (pipeline.py). Never imports training
or the ablation."""
