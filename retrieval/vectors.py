"""Chunk vectors as database bytes: little-endian float32, one row per chunk.

It exists so that the one encoding is written in one place: every host decodes the vectors an
ingest stored and builds the very same index without the embedding model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DTYPE = np.dtype("<f4")


def to_bytes(vector: np.ndarray) -> bytes:
    """One vector ``[dim]`` as the bytes stored in ``chunks.embedding``."""
    return np.ascontiguousarray(vector, dtype=DTYPE).tobytes()


def from_bytes(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """The stored vectors as one float32 matrix ``[len(blobs), dim]``."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    flat = np.frombuffer(b"".join(blobs), dtype=DTYPE)
    if flat.size != len(blobs) * dim:
        raise ValueError(f"stored vectors do not have dimension {dim}")
    return flat.reshape(len(blobs), dim).astype(np.float32, copy=False)


def matrix_to_bytes(matrix: np.ndarray) -> bytes:
    """A whole float32 matrix (IVF centroids ``[nlist, dim]``) as bytes."""
    return np.ascontiguousarray(matrix, dtype=DTYPE).tobytes()


def matrix_from_bytes(blob: bytes, dim: int) -> np.ndarray:
    """The matrix ``[n, dim]`` that ``matrix_to_bytes`` stored."""
    return np.frombuffer(blob, dtype=DTYPE).reshape(-1, dim).astype(np.float32, copy=False)
