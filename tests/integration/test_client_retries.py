"""SpecragClient against a live API on PostgreSQL and Redis: a tenant over its rate is answered
429 with Retry-After, and the client's retries turn a burst into accepted queries, each once."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.client import ClientError, RetryPolicy, SpecragClient
from app.db import Query, make_engine, make_session_factory
from app.settings import Settings
from tests.integration.conftest import Deployment
from tests.integration.streaming import api_server

pytestmark = pytest.mark.integration


def test_retries_ride_out_the_rate_limit_and_never_make_a_second_query(
    private_deployment: Deployment,
) -> None:
    settings: Settings = private_deployment.settings.model_copy(
        update={"tenant_submissions_per_second": 2.0, "tenant_submission_burst": 2}
    )
    with api_server(settings) as url:
        with SpecragClient(
            url, private_deployment.keys["acme"], retry=RetryPolicy(max_attempts=1)
        ) as bare:
            codes = []
            for i in range(6):
                try:
                    bare.submit(f"q{i}?", private_deployment.collection)
                    codes.append(202)
                except ClientError as exc:
                    codes.append(exc.status)
                    assert exc.retry_after is not None and exc.retry_after >= 1
                    assert exc.field == "submissions_per_second"
            assert 429 in codes, codes  # without retries, a burst over the rate loses queries
        with SpecragClient(url, private_deployment.keys["acme"]) as client:
            ids = [client.submit(f"again {i}?", private_deployment.collection) for i in range(8)]
    assert len(set(ids)) == 8
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        stored = session.scalar(
            select(func.count()).select_from(Query).where(Query.question.like("again %"))
        )
    engine.dispose()
    assert stored == 8  # every retried submit made exactly one query


def test_a_burst_of_48_at_default_limits_is_all_accepted_and_answered_once(
    service_settings: Settings, live_worker: object, keys: dict[str, str], ingested: str
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.integration.helpers import ApiServer, stored_rows

    defaults = Settings()
    settings = service_settings.model_copy(
        update={
            "tenant_submissions_per_second": defaults.tenant_submissions_per_second,
            "tenant_submission_burst": defaults.tenant_submission_burst,
        }
    )
    with ApiServer(settings) as api:
        # No retries: the limit itself must admit the burst, as a web backend sends it.
        with SpecragClient(api.url, keys["acme"], retry=RetryPolicy(max_attempts=1)) as client:

            def submit(i: int) -> str:
                return client.submit(f"What does assert do? burst {i}", ingested, max_tokens=2)

            with ThreadPoolExecutor(16) as pool:
                ids = list(pool.map(submit, range(48)))
            views = [client.wait(qid, timeout=300) for qid in ids]
    assert [v["status"] for v in views] == ["succeeded"] * 48
    rows = stored_rows(settings, ids)
    assert all((answers, stats) == (1, 1) for _, answers, stats in rows.values())
