"""CLI command groups; ``app.cli`` assembles them under the ``specrag`` command."""
