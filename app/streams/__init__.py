"""Answer streaming: the worker writes token bursts to a Redis Stream, readers turn them into events.

``publish`` is the worker's side (``open_stream`` → ``QueryStream.on_delta`` / ``finish`` /
``end``), ``hub`` and ``events`` the reader's (API route, ``specrag ask --stream``), ``detok`` the
incremental detokeniser both rely on for text that adds up to the stored answer.
"""

from app.streams.detok import IncrementalDetokenizer
from app.streams.events import END_ID, OPENED, Event, StreamSource, check_last_event_id
from app.streams.publish import QueryStream, open_stream, publisher, stream_key

__all__ = [
    "END_ID",
    "Event",
    "IncrementalDetokenizer",
    "OPENED",
    "QueryStream",
    "StreamSource",
    "check_last_event_id",
    "open_stream",
    "publisher",
    "stream_key",
]
