"""The torch engine's continuous-batching core: who runs this step, and what each request holds.

- ``sequence``: one request's state (tokens, proposer state, stats, its handle).
- ``scheduler``: which requests run this step, by admission order and memory.
- ``step``: ``BatchEngine.step`` (schedule -> prefill -> propose -> run -> verify -> postprocess)
  and ``EngineState``, the runners, slots and prefix cache that one loop owns.
- ``loop``: the online loop thread (submit, stream deltas, cancel at a step boundary).
- ``prefix_cache`` / ``block_index``: reuse of prompt KV across requests (hash-chained blocks).

The package ``__init__`` imports nothing, so importing one module never drags in the others.
"""
