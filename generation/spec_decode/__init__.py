"""Speculative decoding: proposers, verification and the choice of k.

- ``proposers``: what drafts each method proposes for a batch of rows (draft model, n-gram, suffix,
  EAGLE); ``rows``: what they read of a row (a protocol the engine's sequences satisfy).
- ``ngram`` / ``eagle``: the n-gram index over a request's own tokens; the EAGLE head's drafts.
- ``suffix``: suffix trees over a request's own tokens and its scope's past answers
  (``SuffixMemory``, shared by every request of an engine).
- ``rejection_sampler``: the target decides: accepted, recovered and bonus tokens.
- ``sampling``: logits to probabilities and tokens (greedy ties to the lowest id; seeded draws).
- ``goodput`` / ``cost_cache``: the adaptive k (expected tokens per second from measured costs).

The package ``__init__`` imports nothing, so importing one module never drags in the others.
"""
