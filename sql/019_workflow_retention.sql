-- 019_workflow_retention.sql: ended workflows are pruned ("idemflow
-- prune", app/cli/prune.c) after workflow_retention, settable per tenant.
--
-- NULL: the CLI's workflow_retention (30 days by default). "idemflow
-- tenant set-workflow-retention NAME DURATION|default" sets or clears it.
-- Prune reads it for each workflow it considers, at the moment it runs:
-- a change applies to every ended workflow, the ones ended before it too.
ALTER TABLE tenants
    ADD COLUMN workflow_retention interval CHECK (workflow_retention > interval '0');

COMMENT ON COLUMN tenants.workflow_retention IS
    'how long an ended workflow is kept before idemflow prune deletes it; NULL: the CLI''s workflow_retention';

-- Prune walks the ended workflows in (ended_at, tenant_id, id) order from
-- the oldest, up to the earliest cutoff of any tenant. Only ended
-- workflows have ended_at (a resume clears it), so the index holds only
-- them, and a live workflow costs it nothing.
CREATE INDEX IF NOT EXISTS workflows_ended ON workflows (ended_at, tenant_id, id)
    WHERE ended_at IS NOT NULL;

-- A pruned workflow takes the messages it received. Those it has not
-- taken yet have messages_unconsumed; the ones its steps took had no
-- index by workflow.
CREATE INDEX IF NOT EXISTS messages_workflow ON messages (tenant_id, workflow_id)
    WHERE workflow_id IS NOT NULL;
