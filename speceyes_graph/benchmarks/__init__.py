"""Benchmarks: loaders (V*, HR-Bench, POPE, synthetic), scoring, the resumable runner, reports."""

from .datasets import BENCHMARKS, BenchQuery, load_benchmark
from .runner import read_records, run_benchmark
from .scoring import extract_choice, extract_yes_no, is_correct, pope_metrics
from .synthetic import generate_suite

__all__ = [
    "BENCHMARKS",
    "BenchQuery",
    "extract_choice",
    "extract_yes_no",
    "generate_suite",
    "is_correct",
    "load_benchmark",
    "pope_metrics",
    "read_records",
    "run_benchmark",
]
