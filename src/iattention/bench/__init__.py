"""Benchmarks: tokens/s, memory, executed FLOPs and MFU, vs the HF GPT-2 reference."""
