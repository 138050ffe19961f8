import { test } from "node:test";
import assert from "node:assert/strict";
import { createSSEParser } from "../src/sse.js";
import type { SSEMessage } from "../src/sse.js";

interface Parsed {
  messages: SSEMessage[];
  comments: string[];
  retries: number[];
}

function parse(chunks: string[]): Parsed {
  const out: Parsed = { messages: [], comments: [], retries: [] };
  const p = createSSEParser({
    onMessage: (m) => out.messages.push(m),
    onComment: (c) => out.comments.push(c),
    onRetry: (ms) => out.retries.push(ms),
  });
  for (const c of chunks) p.feed(c);
  return out;
}

// Every way of cutting text into two and three chunks must parse as the
// whole does: a network read may end anywhere, even between CR and LF.
function assertSplitsAgree(text: string, want: Parsed) {
  assert.deepEqual(parse([text]), want, "whole");
  for (let i = 0; i <= text.length; i++) {
    assert.deepEqual(parse([text.slice(0, i), text.slice(i)]), want, `split at ${i}`);
    for (let j = i; j <= text.length; j++) {
      assert.deepEqual(parse([text.slice(0, i), text.slice(i, j), text.slice(j)]), want, `split at ${i}, ${j}`);
    }
  }
  // And one character at a time.
  assert.deepEqual(parse([...text]), want, "char by char");
}

// The runner's opening, then a view, in each of the three line ends.
for (const [name, nl] of [["LF", "\n"], ["CRLF", "\r\n"], ["CR", "\r"]] as const) {
  test(`runner stream with ${name} line ends, split anywhere`, () => {
    const text = ["retry: 2000", ": connected", "", "event: task", 'data: {"scope":"course_sync"}', "", ": ping", "", ": token expired", "", ""].join(nl);
    assertSplitsAgree(text, {
      messages: [{ event: "task", data: '{"scope":"course_sync"}', id: "" }],
      comments: ["connected", "ping", "token expired"],
      retries: [2000],
    });
  });
}

test("multi-line data joins with LF; mixed line ends; event type resets after each message", () => {
  const text = "event: task\r\ndata: line1\rdata:line2\ndata\n\ndata: second\n\n";
  assertSplitsAgree(text, {
    messages: [
      { event: "task", data: "line1\nline2\n", id: "" },
      { event: "message", data: "second", id: "" },
    ],
    comments: [],
    retries: [],
  });
});

test("fields: one leading space stripped, unknown ignored, bad retry ignored, id kept", () => {
  const text = "id: 7\nretry: 12x\nretry:500\nfoo: bar\nevent:task\ndata:  two spaces\n\n:no space comment\ndata: x\n\n";
  assertSplitsAgree(text, {
    messages: [
      { event: "task", data: " two spaces", id: "7" },
      { event: "message", data: "x", id: "7" },
    ],
    comments: ["no space comment"],
    retries: [500],
  });
});

test("a blank line without data dispatches nothing; a message cut off by the end is dropped", () => {
  const r = parse(["event: task\n\n", "\n\n", "event: task\ndata: partial"]);
  assert.deepEqual(r.messages, []);
});

test("reset forgets a partial message (a new connection starts clean)", () => {
  const messages: SSEMessage[] = [];
  const p = createSSEParser({ onMessage: (m) => messages.push(m) });
  p.feed("event: task\ndata: old");
  p.reset();
  p.feed("\n\ndata: new\n\n");
  assert.deepEqual(messages, [{ event: "message", data: "new", id: "" }]);
});
