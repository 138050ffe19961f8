import type { ErrorCode } from "./types.js";

/**
 * An error answer of the tasklease API, `{"error": {"code", "message"}}`,
 * with its HTTP status. `code` is one of the API's codes, or `http_<status>`
 * when the body was not the API's (a proxy's page, say).
 */
export class TaskleaseError extends Error {
  override readonly name = "TaskleaseError";
  readonly status: number;
  readonly code: ErrorCode | `http_${number}`;
  /** Seconds to wait, from a `Retry-After` header (503 `too_many_clients`). */
  readonly retryAfter: number | undefined;

  constructor(status: number, code: ErrorCode | `http_${number}`, message: string, retryAfter?: number) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

/** Reads an error response into a TaskleaseError; never throws itself. */
export async function errorFromResponse(res: Response): Promise<TaskleaseError> {
  let code: TaskleaseError["code"] = `http_${res.status}`;
  let message = res.statusText || `HTTP ${res.status}`;
  try {
    const body = (await res.json()) as { error?: { code?: unknown; message?: unknown } };
    if (body && typeof body.error?.code === "string") code = body.error.code as ErrorCode;
    if (body && typeof body.error?.message === "string") message = body.error.message;
  } catch {
    // Not the API's JSON: keep the status line.
  }
  return new TaskleaseError(res.status, code, message, parseRetryAfter(res.headers.get("Retry-After")));
}

/** Retry-After is delta-seconds or an HTTP date (RFC 9110 §10.2.3). */
export function parseRetryAfter(v: string | null, now = Date.now()): number | undefined {
  if (v == null || v.trim() === "") return undefined;
  const s = v.trim();
  if (/^\d+$/.test(s)) return Number(s);
  const t = Date.parse(s);
  if (Number.isNaN(t)) return undefined;
  return Math.max(0, Math.ceil((t - now) / 1000));
}
