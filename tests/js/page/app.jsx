// A chat page on LangGraph's useStream hook, rendering as LangChain's agent-chat-ui does
// (github.com/langchain-ai/agent-chat-ui): tests/test_chat_ui.py serves it from loopback and
// drives it in headless Chromium (tests/js/browser_turn.mjs). Bundled by scripts/setup-js.sh
// (esbuild) into page/dist/app.js.
//
// URL query: apiUrl (the langgraph server), threadId (kept in the URL, as agent-chat-ui
// keeps it, so a reload reopens the thread), assistantId (default speceyes_chat).
import { useStream } from "@langchain/langgraph-sdk/react";
import { useCallback, useRef, useState } from "react";
import { createRoot } from "react-dom/client";

const query = new URLSearchParams(window.location.search);
const API_URL = query.get("apiUrl") ?? "http://127.0.0.1:2024";
const ASSISTANT_ID = query.get("assistantId") ?? "speceyes_chat";

// agent-chat-ui's fileToContentBlock: a picked image becomes a LangChain JS v1 image block
const SUPPORTED_IMAGE_TYPES = ["image/jpeg", "image/png", "image/gif", "image/webp"];

function fileToBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onloadend = () => resolve(String(reader.result).split(",")[1]);
    reader.onerror = reject;
    reader.readAsDataURL(file);
  });
}

async function fileToContentBlock(file) {
  const data = await fileToBase64(file);
  if (SUPPORTED_IMAGE_TYPES.includes(file.type)) {
    return { type: "image", mimeType: file.type, data, metadata: { name: file.name } };
  }
  return { type: "file", mimeType: "application/pdf", data, metadata: { filename: file.name } };
}

// agent-chat-ui's getContentString
function contentString(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((c) => c?.type === "text")
    .map((c) => c.text)
    .join(" ");
}

// agent-chat-ui's MultimodalPreview shows only base64 blocks: image blocks with a mimeType
// starting with image/ and their data
function isBase64Image(block) {
  return (
    block != null &&
    typeof block === "object" &&
    block.type === "image" &&
    typeof block.mimeType === "string" &&
    block.mimeType.startsWith("image/") &&
    typeof block.data === "string"
  );
}

function HumanMessage({ message }) {
  const blocks = Array.isArray(message.content) ? message.content : [];
  const text = contentString(message.content);
  return (
    <div className="msg human" data-testid="human-message" data-message-id={message.id}>
      {blocks.filter(isBase64Image).map((block, i) => (
        <img
          key={i}
          data-testid="human-image"
          alt={block.metadata?.name ?? "uploaded image"}
          src={`data:${block.mimeType};base64,${block.data}`}
        />
      ))}
      {text && <div data-testid="human-text">{text}</div>}
    </div>
  );
}

function AIMessage({ message }) {
  const text = contentString(message.content);
  const toolCalls = message.tool_calls ?? [];
  const meta = message.response_metadata?.speceyes;
  return (
    <div className="msg ai" data-testid="ai-message" data-message-id={message.id}>
      {text && <div data-testid="ai-text">{text}</div>}
      {toolCalls.map((call, i) => (
        <div className="tool-call" data-testid="tool-call" key={call.id ?? i}>
          {call.name}({JSON.stringify(call.args)})
        </div>
      ))}
      {meta?.route && (
        <div className="status" data-testid="ai-route">
          route: {meta.route}
          {typeof meta.score === "number" ? `, score ${meta.score.toFixed(2)}` : ""}
        </div>
      )}
    </div>
  );
}

function ToolMessage({ message }) {
  // the crop the model looked at, where a tool message carries one (its artifact)
  const crop = message.artifact?.crop;
  return (
    <div className="msg tool" data-testid="tool-message" data-message-id={message.id}>
      <div className="status">tool result · {message.name ?? "tool"}</div>
      {contentString(message.content)}
      {crop?.data && crop?.mimeType ? (
        <div>
          <img
            data-testid="tool-crop"
            alt="what the model looked at"
            src={`data:${crop.mimeType};base64,${crop.data}`}
            style={{ width: 64, height: 64, objectFit: "cover", borderRadius: 4 }}
          />
        </div>
      ) : null}
    </div>
  );
}

function App() {
  const [threadId, setThreadId] = useState(query.get("threadId"));
  const onThreadId = useCallback((id) => {
    setThreadId(id);
    const url = new URL(window.location.href);
    if (id) url.searchParams.set("threadId", id);
    else url.searchParams.delete("threadId");
    window.history.replaceState(null, "", url);
  }, []);
  const stream = useStream({
    apiUrl: API_URL,
    assistantId: ASSISTANT_ID,
    threadId,
    onThreadId,
    fetchStateHistory: true,
    messagesKey: "messages",
  });
  // what each render shows, for the test: whether a run ever hides the conversation
  window.__renders ??= [];
  window.__renders.push({
    loading: stream.isLoading,
    kinds: stream.messages.map((m) => m.type),
  });
  const [input, setInput] = useState("");
  const [blocks, setBlocks] = useState([]);
  const fileRef = useRef(null);

  const onFiles = async (event) => {
    const files = Array.from(event.target.files ?? []);
    const added = await Promise.all(files.map(fileToContentBlock));
    setBlocks((prev) => [...prev, ...added]);
  };

  const send = (event) => {
    event.preventDefault();
    if ((!input.trim() && blocks.length === 0) || stream.isLoading) return;
    // agent-chat-ui's handleSubmit: text first, then the attached blocks; optimistic message
    const newHumanMessage = {
      id: crypto.randomUUID(),
      type: "human",
      content: [...(input.trim() ? [{ type: "text", text: input }] : []), ...blocks],
    };
    stream.submit(
      { messages: [newHumanMessage] },
      {
        streamMode: ["values"],
        streamSubgraphs: true,
        streamResumable: true,
        optimisticValues: (prev) => ({
          ...prev,
          messages: [...(prev.messages ?? []), newHumanMessage],
        }),
      },
    );
    setInput("");
    setBlocks([]);
    if (fileRef.current) fileRef.current.value = "";
  };

  return (
    <div>
      <h1>SpecEyes chat</h1>
      <div className="thread" data-testid="thread">
        {stream.messages.map((message, i) => {
          const key = message.id ?? i;
          if (message.type === "human") return <HumanMessage key={key} message={message} />;
          if (message.type === "tool") return <ToolMessage key={key} message={message} />;
          return <AIMessage key={key} message={message} />;
        })}
      </div>
      <form className="composer" onSubmit={send}>
        <input
          ref={fileRef}
          type="file"
          accept="image/jpeg,image/png,image/gif,image/webp,application/pdf"
          multiple
          data-testid="file-input"
          onChange={onFiles}
        />
        <textarea
          data-testid="text-input"
          placeholder="Ask about the image"
          value={input}
          onChange={(e) => setInput(e.target.value)}
        />
        <button type="submit" data-testid="send" disabled={stream.isLoading}>
          Send
        </button>
      </form>
      <div className="status" data-testid="status" data-loading={String(stream.isLoading)}>
        {stream.isLoading ? "running" : "idle"} · {blocks.length} attached · thread{" "}
        {threadId ?? "(new)"}
      </div>
      {stream.error != null && (
        <div className="error" data-testid="error">
          {String(stream.error?.message ?? stream.error)}
        </div>
      )}
    </div>
  );
}

createRoot(document.getElementById("root")).render(<App />);
