"""Models that exist offline: the SmolLM2-135M-Instruct conversion and tiny random models."""
