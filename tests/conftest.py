"""Shared fixtures: a fresh PostgreSQL database, a private Redis DB, a tiny random-weight model pair.

Services that cannot be reached make the tests that need them skip with the reason; nothing here
shares a dirty database between test sessions.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testkit.tokenizer import train_tokenizer
from tests.xdist_plan import share_threads, slowest_first

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO_ROOT / "demo" / "corpus"
PG_HOST = os.environ.get("SPECRAG_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("SPECRAG_TEST_PG_PORT", "5432"))
REDIS_HOST = os.environ.get("SPECRAG_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("SPECRAG_TEST_REDIS_PORT", "6379"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _pg_admin_url() -> str | None:
    """A URL to the maintenance database as the first user that can log in, else None."""
    import psycopg

    for user in ("postgres", "root"):
        for dbname in ("test", "postgres"):
            try:
                with psycopg.connect(
                    host=PG_HOST, port=PG_PORT, user=user, dbname=dbname, connect_timeout=3
                ):
                    return f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{dbname}"
            except psycopg.Error:
                continue
    return None


def migrate(url: str) -> None:
    """Apply the migrations up to head to the database at ``url``."""
    from sqlalchemy import create_engine

    from app.db.schema import upgrade

    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()


_templates: dict[str, str] = {}
"""Per admin URL, this process's database migrated to head that fresh migrated ones copy."""


def _migrated_template(admin: str) -> str:
    """The name of this process's migrated template database (made on first use, dropped at the
    end of the session): copying it is a file copy, a fraction of running every migration."""
    import psycopg

    if admin not in _templates:
        name = f"specrag_template_{uuid.uuid4().hex[:10]}"
        raw = admin.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        # Nothing stays connected to it (migrate disposes its engine): PostgreSQL copies a
        # template only while no one else is connected to it.
        migrate(admin.rsplit("/", 1)[0] + f"/{name}")
        _templates[admin] = name
    return _templates[admin]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the migrated templates this process made."""
    if not _templates:
        return
    import psycopg

    for admin, name in list(_templates.items()):
        raw = admin.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        del _templates[admin]


@contextmanager
def fresh_pg_database(*, migrated: bool = False) -> Iterator[str]:
    """Create an empty PostgreSQL database (``migrated``: at head), yield its URL, drop it after
    (skips without PostgreSQL).

    A migrated one is a copy of this process's template at head (``_migrated_template``); the
    migrations themselves run on empty databases in tests/app/test_migrations.py.
    """
    import psycopg

    admin = _pg_admin_url()
    if admin is None:
        pytest.skip(
            f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT} (run scripts/ensure-services.sh)"
        )
    name = f"specrag_test_{uuid.uuid4().hex[:10]}"
    raw = admin.replace("postgresql+psycopg://", "postgresql://")
    template = f' TEMPLATE "{_migrated_template(admin)}"' if migrated else ""
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{template}')
    try:
        yield admin.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The URL of a PostgreSQL database created empty for this test session, dropped after."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="session")
def migrated_pg_url(pg_url: str) -> str:
    """``pg_url`` with the migrations applied up to head."""
    migrate(pg_url)
    return pg_url


@contextmanager
def claimed_redis_db() -> Iterator[str]:
    """Yield the URL of a Redis database number no other holder has, flushed before and after."""
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=0, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis not reachable on {REDIS_HOST}:{REDIS_PORT}: {exc}")
    claimed = None
    for number in range(1, 16):
        # The claim expires on its own, so a crashed session does not hold a DB for ever.
        if client.set(f"specrag-test-db-claim:{number}", os.getpid(), nx=True, ex=3600):
            claimed = number
            break
    if claimed is None:
        pytest.skip("no free Redis database number (1-15) for this test session")
    db = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=claimed)
    db.flushdb()
    try:
        yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{claimed}"
    finally:
        db.flushdb()
        client.delete(f"specrag-test-db-claim:{claimed}")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL on a database number no other test session holds, flushed before and after."""
    with claimed_redis_db() as url:
        yield url


@pytest.fixture
def private_redis_db() -> Iterator[str]:
    """A Redis database of this test's own on the shared server (it may flush it; the session's
    worker, alive in some test orders, consumes the queues of ``redis_url``)."""
    with claimed_redis_db() as url:
        yield url


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random-weight Llama target (2 layers) and draft (1 layer) sharing a BPE tokenizer.

    Returns ``{"target": dir, "draft": dir}``; both directories hold the tokenizer. Weights are
    seeded, so outputs are reproducible; they are random, so answers are gibberish by design.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny_models")
    tok_dir = root / "tokenizer"
    train_tokenizer(tok_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    dirs = {}
    for name, layers in (("target", 2), ("draft", 1)):
        torch.manual_seed(0 if name == "target" else 1)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
        out = root / name
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        dirs[name] = out
    return dirs


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Tiny instruct pairs with their chat templates (tests/generation/chat_models.py):
    ``{"llama3": {"target", "draft"}, "qwen2": {...}}``."""
    from tests.generation.chat_models import KINDS, save_chat_pair

    root = tmp_path_factory.mktemp("chat_models")
    return {kind: save_chat_pair(kind, root) for kind in KINDS}


# Marks: a file whose every test needs live services or weights declares it (``pytestmark =
# pytest.mark.integration`` / ``pytest.mark.models``: every file in tests/integration and
# tests/models, the tests/generation files that build a model). A test elsewhere that asks for
# a fixture below gets the mark from what it asks for, so that a new test cannot forget it.
# ``make test-fast`` runs what carries neither (`-m "not integration and not models"`).
LIVE_FIXTURES = {
    "pg_url",
    "migrated_pg_url",
    "redis_url",
    "private_redis",
    "private_redis_db",
    "pg_session_factory",
    "batch_env",
}
"""Fixtures that need a live PostgreSQL or Redis (every fixture built on them counts too)."""
MODEL_FIXTURES = {"tiny_models", "chat_models", "embedder", "demo_dirs", "live"}
"""Fixtures that load real weights: tiny random model pairs, MiniLM, the shipped demo pair."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, this process's share of the cores (tests/xdist_plan.py)."""
    share_threads(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``integration`` the tests that ask for live services (a fixture of LIVE_FIXTURES or a
    ``postgresql`` parameter), ``models`` those that ask for weights (MODEL_FIXTURES). Under
    pytest-xdist, the slowest files first (tests/xdist_plan.py)."""
    slowest_first(config, items)
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = set(map(str, callspec.params.values())) if callspec is not None else set()
        if names & LIVE_FIXTURES or "postgresql" in params:
            item.add_marker(pytest.mark.integration)
        if names & MODEL_FIXTURES:
            item.add_marker(pytest.mark.models)
