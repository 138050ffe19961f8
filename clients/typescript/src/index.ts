export { createClient, backoff } from "./client.js";
export type {
  CallOptions,
  ClientOptions,
  HistoryOptions,
  SubmitOptions,
  TaskleaseClient,
  TokenSource,
  Watch,
  WatchOptions,
  WatchStatus,
} from "./client.js";
export { TaskleaseError, parseRetryAfter } from "./errors.js";
export { describeTask, describeSubmit, idleView } from "./describe.js";
export type { DescribeOptions, LabelParams, Labels } from "./describe.js";
export { createSSEParser } from "./sse.js";
export type { SSEHandlers, SSEMessage, SSEParser } from "./sse.js";
export type * from "./types.js";
export type { components, operations, paths } from "./openapi.js";
