// t/contract/ts/usage.ts - a typed use of the client that
// t/contract/test_typescript.sh generates from doc/openapi.yaml with
// openapi-typescript (./idemflow.ts, beside this file in the test's
// directory) and compiles with tsc --strict: the generated types must
// describe a keyed create, its answers and problems, a job by its state,
// the message results and a webhook's event precisely enough for this to
// compile. MIT licensed, like idemflow.

import type { components, paths, webhooks } from "./idemflow.js";

type CreateOp = paths["/v1/workflows"]["post"];
export type WorkflowCreate = CreateOp["requestBody"]["content"]["application/json"];
export type WorkflowCreated = CreateOp["responses"][201]["content"]["application/json"];
export type WorkflowExisting = CreateOp["responses"][200]["content"]["application/json"];
export type Problem = components["schemas"]["Problem"];
type Job = components["schemas"]["Job"];
type Activated = paths["/v1/jobs/activate"]["post"]["responses"][200]["content"]["application/json"];
type MessageResult = components["schemas"]["MessageResult"];
type CreatedEvent = webhooks["workflow.created"]["post"]["requestBody"]["content"]["application/json"];

export class ApiError extends Error {
  constructor(readonly problem: Problem) {
    super(`${problem.status} ${problem.type}: ${problem.detail}`);
  }
}

// One logical create: the caller's key, the same on every retry.
export async function createWorkflow(
  base: string,
  token: string,
  key: string,
  body: WorkflowCreate,
): Promise<WorkflowCreated | WorkflowExisting> {
  const r = await fetch(`${base}/v1/workflows`, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      "Content-Type": "application/json",
      "Idempotency-Key": key,
    },
    body: JSON.stringify(body),
  });
  if (r.status === 201) return (await r.json()) as WorkflowCreated;
  if (r.status === 200) return (await r.json()) as WorkflowExisting;
  throw new ApiError((await r.json()) as Problem);
}

export const order: WorkflowCreate = {
  type: "order",
  input: { order: 42 },
  business_key: "order-42",
  steps: [
    { name: "reserve", job_type: "stock", retries: 1, on_failure: "incident" },
    { name: "await-payment", wait_for: "paid", timeout: "PT1H" },
  ],
};

// The answers: the created workflow is pending; an existing one says so.
export function describe(w: WorkflowCreated | WorkflowExisting): string {
  const state: "pending" | "running" | "incident" | "completed" | "failed" | "cancelled" = w.state;
  return "existing" in w && w.existing === true ? `existing ${w.id}` : `${state} ${w.id}`;
}

// A job narrows by its state: only an active one has a lease deadline.
export function leaseEnd(job: Job): string | undefined {
  if (job.state === "active") {
    const deadline: string = job.deadline;
    return deadline;
  }
  return undefined;
}

export function firstLease(a: Activated): string | undefined {
  const [first] = a.jobs;
  return first === undefined ? undefined : leaseEnd(first);
}

// A message result narrows by correlated: only a correlated one has a step.
export function stepOf(m: MessageResult): number | undefined {
  return m.correlated ? m.step : undefined;
}

// A webhook's event, typed by its type.
export function workflowOf(e: CreatedEvent): string {
  const t: "workflow.created" = e.type;
  return `${t} ${e.data.id}`;
}
