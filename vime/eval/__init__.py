"""Evaluation: metrics over sampled answers (pass@k, maj@k, rewards, confidence intervals)."""
