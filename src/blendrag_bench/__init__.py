"""Benchmarks: TTFT and memory per mode, store throughput, answer quality."""
