-- headroom's request log in ClickHouse, fed in real time by `headroom run --otlp-endpoint URL
-- --otlp-logs` through an OpenTelemetry Collector (collector.yaml) into `otel_logs`.
--
-- `headroom_requests` has the columns of headroom's `requests` table (collector/record.py,
-- RequestRecord), typed, and the materialized view fills it from each
-- `gen_ai.client.inference.operation.details` event as it is inserted. An exporter that retries a
-- batch inserts the same event twice, so the table is a ReplacingMergeTree keyed on request_id, so
-- such copies collapse at merge time and `FINAL` (or GROUP BY request_id) reads each request once.
-- Run after otel_logs exists: clickhouse-client --multiquery < requests.sql
CREATE TABLE IF NOT EXISTS headroom_requests
(
    request_id String,
    source LowCardinality(Nullable(String)),
    run_id Nullable(String),
    instance LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    tenant LowCardinality(Nullable(String)),
    endpoint LowCardinality(Nullable(String)),
    stream Nullable(Bool),
    admitted_at DateTime64(6, 'UTC'),
    first_byte_at Nullable(DateTime64(6, 'UTC')),
    first_token_at Nullable(DateTime64(6, 'UTC')),
    completed_at Nullable(DateTime64(6, 'UTC')),
    status_code Nullable(Int32),
    outcome LowCardinality(Nullable(String)),
    error Nullable(String),
    prompt_tokens Nullable(Int32),
    cached_prompt_tokens Nullable(Int32),
    completion_tokens Nullable(Int32),
    max_tokens Nullable(Int32),
    usage_source LowCardinality(Nullable(String)),
    ttft_s Nullable(Float64),
    tpot_s Nullable(Float64),
    e2e_s Nullable(Float64),
    inflight_at_admit Nullable(Int32),
    active_tokens_at_admit Nullable(Int64),
    engine_waiting_at_admit Nullable(Int32),
    kv_usage_at_admit Nullable(Float64),
    upstream_retries Nullable(Int32),
    task_class LowCardinality(Nullable(String)),
    adapter LowCardinality(Nullable(String)),
    probe_level Nullable(Int32),
    probe_rate_per_s Nullable(Float64),
    probe_warmup Nullable(Bool),
    replica_class LowCardinality(Nullable(String)),
    client_request_id Nullable(String),
    failure LowCardinality(Nullable(String)),
    held_prompt_tokens Nullable(Int32),
    held_generated_tokens Nullable(Int32)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(admitted_at)
ORDER BY request_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS headroom_requests_mv TO headroom_requests AS
SELECT
    LogAttributes['headroom.request_id'] AS request_id,
    nullIf(LogAttributes['headroom.source'], '') AS source,
    nullIf(LogAttributes['headroom.run_id'], '') AS run_id,
    nullIf(LogAttributes['headroom.instance'], '') AS instance,
    nullIf(LogAttributes['gen_ai.request.model'], '') AS model,
    nullIf(LogAttributes['headroom.tenant'], '') AS tenant,
    nullIf(LogAttributes['url.path'], '') AS endpoint,
    multiIf(LogAttributes['gen_ai.request.stream'] = 'true', true,
            LogAttributes['gen_ai.request.stream'] = 'false', false, NULL) AS stream,
    parseDateTime64BestEffort(LogAttributes['headroom.admitted_at'], 6, 'UTC') AS admitted_at,
    parseDateTime64BestEffortOrNull(LogAttributes['headroom.first_byte_at'], 6, 'UTC') AS first_byte_at,
    parseDateTime64BestEffortOrNull(LogAttributes['headroom.first_token_at'], 6, 'UTC') AS first_token_at,
    parseDateTime64BestEffortOrNull(LogAttributes['headroom.completed_at'], 6, 'UTC') AS completed_at,
    toInt32OrNull(LogAttributes['http.response.status_code']) AS status_code,
    nullIf(LogAttributes['headroom.outcome'], '') AS outcome,
    nullIf(LogAttributes['headroom.error'], '') AS error,
    toInt32OrNull(LogAttributes['gen_ai.usage.input_tokens']) AS prompt_tokens,
    toInt32OrNull(LogAttributes['gen_ai.usage.cache_read.input_tokens']) AS cached_prompt_tokens,
    toInt32OrNull(LogAttributes['gen_ai.usage.output_tokens']) AS completion_tokens,
    toInt32OrNull(LogAttributes['gen_ai.request.max_tokens']) AS max_tokens,
    nullIf(LogAttributes['headroom.usage_source'], '') AS usage_source,
    toFloat64OrNull(LogAttributes['gen_ai.response.time_to_first_chunk']) AS ttft_s,
    toFloat64OrNull(LogAttributes['headroom.tpot_s']) AS tpot_s,
    toFloat64OrNull(LogAttributes['headroom.e2e_s']) AS e2e_s,
    toInt32OrNull(LogAttributes['headroom.inflight_at_admit']) AS inflight_at_admit,
    toInt64OrNull(LogAttributes['headroom.active_tokens_at_admit']) AS active_tokens_at_admit,
    toInt32OrNull(LogAttributes['headroom.engine_waiting_at_admit']) AS engine_waiting_at_admit,
    toFloat64OrNull(LogAttributes['headroom.kv_usage_at_admit']) AS kv_usage_at_admit,
    toInt32OrNull(LogAttributes['headroom.upstream_retries']) AS upstream_retries,
    nullIf(LogAttributes['headroom.task_class'], '') AS task_class,
    nullIf(LogAttributes['headroom.adapter'], '') AS adapter,
    toInt32OrNull(LogAttributes['headroom.probe_level']) AS probe_level,
    toFloat64OrNull(LogAttributes['headroom.probe_rate_per_s']) AS probe_rate_per_s,
    multiIf(LogAttributes['headroom.probe_warmup'] = 'true', true,
            LogAttributes['headroom.probe_warmup'] = 'false', false, NULL) AS probe_warmup,
    nullIf(LogAttributes['headroom.replica_class'], '') AS replica_class,
    nullIf(LogAttributes['headroom.client_request_id'], '') AS client_request_id,
    nullIf(LogAttributes['headroom.failure'], '') AS failure,
    toInt32OrNull(LogAttributes['headroom.held_prompt_tokens']) AS held_prompt_tokens,
    toInt32OrNull(LogAttributes['headroom.held_generated_tokens']) AS held_generated_tokens
FROM otel_logs
WHERE EventName = 'gen_ai.client.inference.operation.details'
  AND LogAttributes['headroom.request_id'] != '';
