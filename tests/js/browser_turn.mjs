// One chat turn through the useStream test page (tests/js/page) in headless Chromium, as a
// person does it: pick an image file, type the question, send, wait for the answer; then
// reload the page (the thread id is in its URL) and check the thread comes back.
//
//   node tests/js/browser_turn.mjs PAGE_URL IMAGE.png QUESTION EXPECTED SCREENSHOT.png [--expect-tool-calls]
//
// PAGE_URL carries the server as ?apiUrl=. Drives Debian's /usr/bin/chromium (or
// $SPECEYES_CHROMIUM) through playwright-core; never downloads a browser. Prints one JSON
// object to stdout: {thread_id, url, before, after, streaming}: snapshots of the rendered
// thread before and after the reload, and what the renders showed while the run streamed.
// Exits 1 with the last snapshot, the page's console and failed requests on stderr when a
// step does not happen in time.
import { chromium } from "playwright-core";

const args = process.argv.slice(2);
const expectToolCalls = args.includes("--expect-tool-calls");
const [pageUrl, imagePath, question, expected, screenshotPath] = args.filter(
  (a) => !a.startsWith("--"),
);
if (!screenshotPath) {
  console.error(
    "usage: node browser_turn.mjs PAGE_URL IMAGE.png QUESTION EXPECTED SCREENSHOT.png [--expect-tool-calls]",
  );
  process.exit(2);
}
const TIMEOUT_MS = Number(process.env.SPECEYES_BROWSER_TIMEOUT_MS ?? 45000);
const t0 = performance.now();
const log = (line) => console.error(`[browser ${((performance.now() - t0) / 1000).toFixed(1)}s] ${line}`);

// What the page shows, as plain data (the thread's messages in order).
function snapshot(page) {
  return page.evaluate(() => {
    const messages = [...document.querySelectorAll("[data-testid=thread] > [data-testid]")].map(
      (el) => ({
        kind: el.dataset.testid,
        id: el.dataset.messageId ?? null,
        text:
          el.querySelector("[data-testid=ai-text], [data-testid=human-text]")?.textContent ??
          (el.dataset.testid === "tool-message" ? el.textContent : ""),
        images: [...el.querySelectorAll("img")].map((img) => ({
          complete: img.complete,
          naturalWidth: img.naturalWidth,
          visible: img.getBoundingClientRect().width > 0,
          src_chars: img.src.length,
        })),
        tool_calls: [...el.querySelectorAll("[data-testid=tool-call]")].map((c) => c.textContent),
        route: el.querySelector("[data-testid=ai-route]")?.textContent ?? null,
      }),
    );
    const status = document.querySelector("[data-testid=status]");
    return {
      url: window.location.href,
      loading: status?.dataset.loading === "true",
      status: status?.textContent ?? null,
      error: document.querySelector("[data-testid=error]")?.textContent ?? null,
      messages,
    };
  });
}

const answered = (s) =>
  !s.loading &&
  s.messages.some((m) => m.kind === "ai-message" && m.text.trim().startsWith(expected));
const toolsShown = (s) =>
  s.messages.some((m) => m.tool_calls.length > 0) &&
  s.messages.some((m) => m.kind === "tool-message");
const imageShown = (s) =>
  s.messages.some(
    (m) => m.kind === "human-message" && m.images.some((i) => i.complete && i.naturalWidth > 0 && i.visible),
  );

let last = null;
async function until(page, what, predicate) {
  const started = performance.now();
  let settled = 0; // polls in a row with the run over and a reply shown: nothing more is coming
  while (performance.now() < started + TIMEOUT_MS && settled < 12) {
    last = await snapshot(page);
    if (predicate(last)) {
      log(`${what}: yes`);
      return last;
    }
    if (last.error && !last.loading) break; // useStream reported a failure: no point waiting
    const over = !last.loading && last.messages.some((m) => m.kind === "ai-message");
    settled = over ? settled + 1 : 0;
    await page.waitForTimeout(250);
  }
  const ms = Math.round(performance.now() - started);
  throw new Error(`${what}: not after ${ms} ms; the page shows:\n${JSON.stringify(last, null, 1)}`);
}

const browser = await chromium.launch({
  executablePath: process.env.SPECEYES_CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  // root in a container: no user namespaces for Chromium's sandbox
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
});
let status = 0;
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
  page.on("console", (m) => log(`console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => log(`pageerror: ${e.stack ?? e}`));
  page.on("requestfailed", (r) => log(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400) log(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });

  await page.goto(pageUrl);
  await page.getByTestId("file-input").setInputFiles(imagePath);
  await until(page, "image attached", (s) => (s.status ?? "").includes("1 attached"));
  await page.getByTestId("text-input").fill(question);
  await page.getByTestId("send").click();
  log("sent");
  await until(page, "thread id in the URL", (s) => new URL(s.url).searchParams.has("threadId"));
  let before = await until(page, `answered "${expected}"`, answered);
  if (expectToolCalls) before = await until(page, "tool calls shown", toolsShown);
  before = await until(page, "the human image shown", imageShown);
  // every render of the run: does the conversation stay on screen while the run streams?
  // (useStream replaces its values with each values event, a subgraph's included)
  const renders = await page.evaluate(() => window.__renders ?? []);
  const sent = renders.findIndex((r) => r.loading && r.kinds.includes("human"));
  const during = sent < 0 ? [] : renders.slice(sent).filter((r) => r.loading);
  const streaming = {
    renders: renders.length,
    while_loading: during.length,
    without_the_human_message: during.filter((r) => !r.kinds.includes("human")).length,
    kinds_seen: [...new Set(during.map((r) => r.kinds.join(",")))],
  };
  log(`while streaming: ${JSON.stringify(streaming)}`);
  await page.screenshot({ path: screenshotPath });
  log(`screenshot: ${screenshotPath}`);

  const threadId = new URL(before.url).searchParams.get("threadId");
  await page.reload();
  log("reloaded");
  const after = await until(
    page,
    "after the reload: image, answer" + (expectToolCalls ? ", tool calls" : ""),
    (s) => imageShown(s) && answered(s) && (!expectToolCalls || toolsShown(s)),
  );
  process.stdout.write(JSON.stringify({ thread_id: threadId, url: before.url, before, after, streaming }) + "\n");
} catch (err) {
  console.error(err?.stack ?? String(err));
  status = 1;
} finally {
  await browser.close();
}
process.exit(status);
