"""Evaluation: the half-truth benchmark (halftruth/), compositional suites (suites/),
retrieval, zero-shot classification, one encoder with its feature cache per model
(encoder.py), reports (report.py), the pipeline (pipeline.py), frozen benchmark files
(benchmark_file.py) and checkpoint selection (selection.py). Never imports training, the
ablation or csclip.report."""

__all__ = ["benchmark_file", "encoder", "halftruth", "pipeline", "report", "retrieval",
           "selection", "suites", "zeroshot", "zeroshot_paper"]
