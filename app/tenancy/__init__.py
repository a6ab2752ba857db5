"""Tenant safety: per-tenant limits (records, resolution, checks) and uploaded documents' state."""
