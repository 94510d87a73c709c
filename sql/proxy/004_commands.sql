-- proxy/004_commands.sql: the unkeyed create, the list of workflows, an
-- endpoint, the list of endpoints, the event feed, an endpoint's secret,
-- attempts and undelivered events and an event's deliveries through the proxy,
-- on the tenant's partition (sql/026_partition_commands.sql).

CREATE FUNCTION idemflow_create_unkeyed(
    p_tenant bigint, p_created_at timestamptz, p_id uuid, p_type text, p_input jsonb,
    p_event_id text, p_payload_head text, p_payload_tail text,
    p_traceparent text, p_tracestate text, p_actor text)
RETURNS integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_wf_list(p_tenant bigint, p_state text, p_type text, p_after uuid,
                                 p_limit integer, p_budget bigint)
RETURNS TABLE (id uuid, type text, state text, input text, created_at text, business_key text,
               steps text, step integer, within boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_endpoint_get(p_tenant bigint, p_id uuid)
RETURNS TABLE (id uuid, url text, filter_types text, ordering text, disabled boolean,
               disabled_reason text, metadata text, created_at text, updated_at text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_endpoint_list(p_tenant bigint, p_after uuid, p_limit integer,
                                       p_budget bigint)
RETURNS TABLE (id uuid, url text, filter_types text, ordering text, disabled boolean,
               disabled_reason text, metadata text, created_at text, updated_at text,
               within boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_events_feed(p_tenant bigint, p_after bigint, p_limit integer,
                                     p_budget bigint, p_scan integer)
RETURNS TABLE (id bigint, payload text, within boolean, actor text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_endpoint_secret(p_tenant bigint, p_id uuid)
RETURNS TABLE (secret text, previous_secret text, previous_secret_until text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_event_deliveries(p_tenant bigint, p_event text, p_after uuid,
                                          p_limit integer, p_budget bigint)
RETURNS TABLE (endpoint_id uuid, event_id text, state text, attempts integer,
               next_attempt_at text, last_error text, updated_at text, within boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_endpoint_undelivered(p_tenant bigint, p_id uuid, p_after_stream uuid,
                                              p_after_seq integer, p_states text[],
                                              p_limit integer, p_budget bigint)
RETURNS TABLE (event_id text, endpoint_id uuid, state text, attempts integer,
               next_attempt_at text, last_error text, updated_at text, within boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_endpoint_attempts(p_tenant bigint, p_id uuid, p_before bigint,
                                           p_outcome text, p_status integer, p_limit integer,
                                           p_budget bigint)
RETURNS TABLE (id bigint, event_id text, trigger text, started_at text,
               duration_ms double precision, status integer, outcome text, response text,
               within boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;
