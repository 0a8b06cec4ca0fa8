"""Evaluation: the half-truth benchmark (halftruth/), compositional suites (suites/),
retrieval, zero-shot classification, one encoder with its feature cache per model
(encoder.py), reports (report.py), the pipeline (pipeline.py), frozen benchmark files
(benchmark_file.py), checkpoint selection (selection.py) and evaluation sets read from
webdataset shards (shards.py). Never imports training, the ablation or csclip.report."""

__all__ = ["benchmark_file", "encoder", "halftruth", "pipeline", "report", "retrieval",
           "selection", "shards", "suites", "zeroshot", "zeroshot_paper"]
