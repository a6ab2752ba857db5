"""The HTTP API for the product's web backend (FastAPI)."""

from app.api.main import create_app

__all__ = ["create_app"]
