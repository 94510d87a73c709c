// t/contract/ts/bad.ts - must NOT compile (t/contract/test_typescript.sh):
// a create without its required type, and a deadline read from a job that
// may not be active. A compile that accepts it would prove nothing.

import type { components, paths } from "./idemflow.js";

type WorkflowCreate = paths["/v1/workflows"]["post"]["requestBody"]["content"]["application/json"];

export const missingType: WorkflowCreate = { input: { order: 42 } };

export function deadlineOfAny(job: components["schemas"]["Job"]): string {
  return job.deadline;
}
