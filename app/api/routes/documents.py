"""``/v1/documents``: upload files into a collection, list them, delete one (tenant-scoped).

Uploads and deletions run on the ``ingest`` queue (the API never loads the embedding model), so
both answer 202; ``GET`` shows when a document has landed. A refused request queues nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from app.api.body import ParsedRoute
from app.api.deps import (
    DispatcherDep,
    EnforcerDep,
    SessionDep,
    SettingsDep,
    TenantDep,
    rate_counted,
)
from app.api.errors import ApiError
from app.api.schemas import ErrorOut
from app.documents.state import mark_pending, restore
from app.documents.upload import list_documents, validate_uploads
from app.tenancy.collections import check_new_collection

router = APIRouter(prefix="/v1/documents", tags=["documents"], route_class=ParsedRoute)
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    404: {"model": ErrorOut},
    422: {"model": ErrorOut},
    503: {"model": ErrorOut},
}


class DocumentIn(BaseModel):
    """One file of an upload."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(description="File name with its extension (.txt .md .html .pdf).")
    content: str = Field(description="The file's text, or its bytes in base64.")
    encoding: Literal["text", "base64"] = Field("text", description="How `content` is encoded.")


class UploadIn(BaseModel):
    """Files to ingest into one of the caller's collections."""

    model_config = ConfigDict(extra="forbid", strict=True)

    collection: str
    documents: list[DocumentIn]


def _send(send: Callable[[], None]) -> None:
    try:
        send()
    except Exception as exc:  # broker down: nothing was stored, so refuse with the reason
        raise ApiError(503, "broker", f"the ingest queue is unreachable, try again: {exc}") from exc


@router.post("", status_code=202, responses=ERRORS)
def upload(
    body: UploadIn,
    caller: TenantDep,
    session: SessionDep,
    settings: SettingsDep,
    dispatcher: DispatcherDep,
    enforcer: EnforcerDep,
    request: Request,
) -> dict:
    """Queue the files for ingest; re-uploading an unchanged file is a no-op.

    Each file is checked here (type, encoding, a PDF that opens), so a bad file is a 422 now;
    its state (pending, then indexed or failed with the reason) shows in ``GET``.
    """

    uploads = validate_uploads(
        body.collection, [d.model_dump() for d in body.documents], settings.max_file_bytes
    )
    size = sum(len(u.content) for u in uploads)
    limits = enforcer.upload(session, caller.tenant_id, size, rate=not rate_counted(request))
    files = [u.to_message() for u in uploads]
    try:
        # After the quota (whose store may take a connection of its own), refunded if refused.
        check_new_collection(session, limits, caller.tenant, body.collection)
        before = mark_pending(session, caller.tenant, body.collection, uploads)
        try:
            _send(
                lambda: dispatcher.send_uploads(
                    files, body.collection, caller.tenant, limits.max_extracted_chars
                )
            )
        except ApiError:
            restore(session, caller.tenant, body.collection, before)  # nothing half-written
            raise
    except Exception:
        session.rollback()
        enforcer.refund_upload(session, caller.tenant_id, size)  # a refused upload costs nothing
        raise
    return {
        "status": "queued",
        "collection": body.collection,
        "documents": [u.name for u in uploads],
    }


@router.get("", responses=ERRORS)
def list_(caller: TenantDep, session: SessionDep, collection: str = Query(...)) -> dict:
    """The caller's documents in ``collection`` with their chunk counts."""
    return {
        "collection": collection,
        "documents": list_documents(session, caller.tenant, collection),
    }


@router.delete("", status_code=202, responses=ERRORS)
def delete(
    caller: TenantDep,
    session: SessionDep,
    dispatcher: DispatcherDep,
    collection: str = Query(...),
    document: str = Query(..., description="The document's source, as GET lists it."),
) -> dict:
    """Queue the removal of one document from the index and the database."""
    known = {d["document"] for d in list_documents(session, caller.tenant, collection)}
    if document not in known:
        raise ApiError(404, "document", f"no document {document!r} in collection {collection!r}")
    _send(lambda: dispatcher.send_delete(document, collection, caller.tenant))
    return {"status": "queued", "collection": collection, "document": document}
