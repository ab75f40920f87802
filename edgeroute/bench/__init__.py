"""Benchmarks: each prints a table and writes JSON and Markdown under bench/results/."""
