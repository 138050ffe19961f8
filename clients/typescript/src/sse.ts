/** One dispatched Server-Sent Events message. */
export interface SSEMessage {
  /** The `event:` field; `"message"` when the message had none. */
  event: string;
  /** The `data:` lines joined by "\n". */
  data: string;
  /** The last event ID seen so far (`id:`), "" when none. */
  id: string;
}

export interface SSEHandlers {
  onMessage(message: SSEMessage): void;
  /** A comment line's text without the colon and one leading space. */
  onComment?(text: string): void;
  /** A valid `retry:` field, in milliseconds. */
  onRetry?(ms: number): void;
}

export interface SSEParser {
  /** Feeds decoded text; it may end anywhere, even inside a CRLF. */
  feed(chunk: string): void;
  /** Forgets a partial line and message, as a new connection must. */
  reset(): void;
}

/**
 * A parser for the event stream format of the HTML standard
 * (§9.2.6 "Interpreting an event stream"): lines end in CRLF, LF or CR; a
 * blank line dispatches; `data` lines accumulate; comments start with ":";
 * a message cut off by the end of the stream is never dispatched (the
 * caller just stops feeding).
 */
export function createSSEParser(handlers: SSEHandlers): SSEParser {
  let buf = "";
  // A chunk that ended in CR may be followed by the LF of the same CRLF.
  let skipLF = false;
  let data = "";
  let hasData = false;
  let event = "";
  let lastId = "";

  function line(l: string): void {
    if (l === "") {
      if (hasData) {
        handlers.onMessage({ event: event || "message", data, id: lastId });
      }
      data = "";
      hasData = false;
      event = "";
      return;
    }
    if (l.charCodeAt(0) === 0x3a /* : */) {
      handlers.onComment?.(l.slice(l.charCodeAt(1) === 0x20 ? 2 : 1));
      return;
    }
    const colon = l.indexOf(":");
    let field = l;
    let value = "";
    if (colon >= 0) {
      field = l.slice(0, colon);
      value = l.slice(colon + 1);
      if (value.charCodeAt(0) === 0x20) value = value.slice(1);
    }
    switch (field) {
      case "event":
        event = value;
        break;
      case "data":
        data = hasData ? data + "\n" + value : value;
        hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) lastId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) handlers.onRetry?.(Number(value));
        break;
      default:
      // Unknown fields are ignored.
    }
  }

  return {
    feed(chunk: string): void {
      // An empty read must not forget a CR that ended the previous one.
      if (chunk === "") return;
      if (skipLF && chunk.charCodeAt(0) === 0x0a) chunk = chunk.slice(1);
      skipLF = false;
      buf += chunk;
      let start = 0;
      for (;;) {
        let i = start;
        const n = buf.length;
        while (i < n) {
          const c = buf.charCodeAt(i);
          if (c === 0x0a || c === 0x0d) break;
          i++;
        }
        if (i >= n) break;
        const l = buf.slice(start, i);
        if (buf.charCodeAt(i) === 0x0d) {
          if (i + 1 < n) {
            start = buf.charCodeAt(i + 1) === 0x0a ? i + 2 : i + 1;
          } else {
            start = i + 1;
            skipLF = true;
          }
        } else {
          start = i + 1;
        }
        line(l);
      }
      buf = buf.slice(start);
    },
    reset(): void {
      buf = "";
      skipLF = false;
      data = "";
      hasData = false;
      event = "";
    },
  };
}
