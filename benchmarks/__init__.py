"""The curated benchmark suite: each module backs rows of docs/results.md.

Run one as ``python -m benchmarks.NAME`` from the repository root; it prints its tables and
writes its figures to ``benchmarks/results/NAME.json`` (benchmarks/support.py's ``write_result``).
``make results`` renders docs/results.md from those files.
"""
