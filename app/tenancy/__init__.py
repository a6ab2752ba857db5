"""Tenant safety: per-tenant limits (records, resolution, checks), rate windows, the collection cap."""
