"""The model itself: loading checkpoints, the forward pass, attention, KV memory, numerics.

- ``loading``: a Hugging Face-format checkpoint into the engine's own forward (no hub).
- ``forward`` / ``attention`` (+ ``attention.c``): one batched pass over slots of KV memory.
- ``kv_store``: the KV tensors, one slot per running request.
- ``model_runner``: one batched forward for a list of rows (prefill chunks and decode rows).
- ``dtypes``: float32 / bfloat16 choice for this host.

The package ``__init__`` imports nothing, so importing one module never drags in the others.
"""
