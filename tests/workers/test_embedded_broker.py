"""The embedded broker (kombu's SQLAlchemy transport on SQLite) polls at the configured interval."""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings
from workers import create_celery


def test_the_embedded_broker_polls_at_the_setting_and_carries_messages(tmp_path: Path) -> None:
    app = create_celery(Settings(data_dir=tmp_path, broker_polling_interval=0.05))
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.transport.polling_interval == 0.05
        queue = conn.SimpleQueue("serving-test")
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        message.ack()
        assert message.payload == {"n": 1}
        queue.close()
