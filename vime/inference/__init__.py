"""Inference: vLLM engines behind vllm-router, the token-level client, weight updates, faults."""
