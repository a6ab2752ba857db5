"""What tests and benchmarks share: private services, a tiny tokenizer, seeded stored traffic,
labeled grounding sets, the paired comparison of service variants on a shared machine.

Both ``tests/`` and ``benchmarks/`` import this package; it imports neither of them, and nothing
of the product imports it. Its modules import their heavy dependencies (psycopg, redis,
tokenizers, transformers) inside the functions that use them, so importing it costs nothing.
"""
