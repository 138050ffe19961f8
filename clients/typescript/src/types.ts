// Names for the generated OpenAPI types (src/openapi.ts, from
// internal/httpapi/openapi.json): every wire type of this package comes
// from there, so a change of the API document changes them too.
import type { components, operations } from "./openapi.js";

type Schemas = components["schemas"];
type JSONBody<T> = T extends { content: { "application/json": infer B } } ? B : never;

/** What users see of a task (docs/http-api.md). */
export type TaskView = Schemas["TaskView"];
export type TaskStatus = Schemas["TaskStatus"];
export type Source = Schemas["Source"];
export type Policy = Schemas["Policy"];
export type SubmitOutcome = Schemas["SubmitOutcome"];
export type CancelOutcome = Schemas["CancelOutcome"];
/** One entry of a task's history, newest first in `history()`. */
export type HistoryEvent = Schemas["Event"];
export type ErrorCode = Schemas["Error"]["error"]["code"];

/** The body of POST /v1/tasks/{subject}/{scope}/runs. */
export type SubmitRequest = JSONBody<NonNullable<operations["submitRun"]["requestBody"]>>;
/** `{outcome, runId?, task}`: what a submit did, and the task's view. */
export type SubmitResponse = JSONBody<operations["submitRun"]["responses"][200]>;
export type CancelResponse = JSONBody<operations["cancelTask"]["responses"][200]>;
export type HistoryResponse = JSONBody<operations["getTaskHistory"]["responses"][200]>;
export type HistoryQuery = NonNullable<operations["getTaskHistory"]["parameters"]["query"]>;
export type ForegroundRequest = JSONBody<operations["foregroundHook"]["requestBody"]>;
export type ForegroundResponse = JSONBody<operations["foregroundHook"]["responses"][200]>;
export type ForegroundResult = Schemas["ForegroundResult"];
