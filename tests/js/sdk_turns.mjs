// Drive a served chat graph as chat UIs do, through @langchain/langgraph-sdk's Client.
//
//   node tests/js/sdk_turns.mjs SERVER_URL CASES.json
//
// CASES.json: [{"name": ..., "turns": [[block, ...], ...], "assistant": "speceyes_chat"?}];
// each turn is the content of one human message. For each case: a new thread, then each turn
// streamed with the stream modes useStream asks for ("values", "messages-tuple") plus
// "custom", subgraphs included (agent-chat-ui submits with streamSubgraphs: true); then the
// thread's state and its last 10 checkpoints. Prints one JSON object per case and line:
//   {name, thread_id, turns: [{events: [{event, data}], ms, error, state}], state, history,
//    history_bytes}
// (each turn's state: the thread's values after it; state and history: after the last turn)
// A case that fails records its error and the script goes on; the exit status is 0 unless
// the arguments or the server are unusable. Diagnostics go to stderr.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { Client } from "@langchain/langgraph-sdk";

const [serverUrl, casesFile] = process.argv.slice(2);
if (!serverUrl || !casesFile) {
  console.error("usage: node sdk_turns.mjs SERVER_URL CASES.json");
  process.exit(2);
}
const cases = JSON.parse(readFileSync(casesFile, "utf8"));
const client = new Client({ apiUrl: serverUrl, callerOptions: { maxRetries: 0 } });

function errorText(err) {
  return err?.stack ?? String(err);
}

async function runCase(c) {
  const assistant = c.assistant ?? "speceyes_chat";
  const out = { name: c.name, thread_id: null, turns: [], state: null, history: null };
  const thread = await client.threads.create();
  out.thread_id = thread.thread_id;
  for (const content of c.turns) {
    // as agent-chat-ui sends a turn: a message with its own id, type "human"
    const message = { id: randomUUID(), type: "human", content };
    const turn = { events: [], ms: null, error: null };
    const t0 = performance.now();
    try {
      for await (const chunk of client.runs.stream(thread.thread_id, assistant, {
        input: { messages: [message] },
        streamMode: ["values", "messages-tuple", "custom"],
        streamSubgraphs: true,
      })) {
        turn.events.push({ event: chunk.event, data: chunk.data });
      }
    } catch (err) {
      turn.error = errorText(err);
      console.error(`[${c.name}] stream failed: ${turn.error}`);
    }
    turn.ms = Math.round(performance.now() - t0);
    turn.state = (await client.threads.getState(thread.thread_id)).values; // after this turn
    const names = [...new Set(turn.events.map((e) => e.event))].join(", ");
    console.error(`[${c.name}] turn ${out.turns.length + 1}: ${turn.ms} ms, events: ${names}`);
    out.turns.push(turn);
  }
  const state = await client.threads.getState(thread.thread_id);
  out.state = state.values;
  out.history = await client.threads.getHistory(thread.thread_id, { limit: 10 });
  out.history_bytes = Buffer.byteLength(JSON.stringify(out.history));
  return out;
}

for (const c of cases) {
  let out;
  try {
    out = await runCase(c);
  } catch (err) {
    console.error(`[${c.name}] failed: ${errorText(err)}`);
    out = { name: c.name, error: errorText(err) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
