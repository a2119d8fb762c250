"""Evaluation: metrics over sampled answers (pass@k, maj@k, rewards, confidence intervals) and
the ``vime eval`` harness (``runner.evaluate``: resumable results, retrying client, reports)."""
