// Drives the page at `/` of a running `ft-actor serve` in headless Chromium through
// playwright-core and checks what a person would see: the page loads, a message streams a
// reply, the engine view updates, thinking and tool calls render, Stop and Reset work.
//
// Usage: node page_test.js BASE_URL, with FT_PLAYWRIGHT_CORE (the playwright-core package
// folder) and FT_CHROMIUM (the browser) set; FT_WEB_SCREENSHOT=FILE saves a screenshot.
// Exits non-zero on the first failed check.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');

const base = process.argv[2];
const { chromium } = require(process.env.FT_PLAYWRIGHT_CORE || 'playwright-core');

// Without the background-networking flags Chromium waits on services it cannot reach here.
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

let passed = 0;
function check(cond, what, detail) {
  if (!cond) throw new Error(`FAILED: ${what}${detail === undefined ? '' : `: ${JSON.stringify(detail)}`}`);
  passed++;
  console.log(`ok - ${what}`);
}

const num = (s) => Number(String(s).replace(/[^0-9.]/g, ''));

/** Starts recording, on every change under #messages, the text of the last reply and whether
 * it was still streaming; read back with `samples()`. */
async function record(page) {
  await page.evaluate(() => {
    window.__samples = [];
    const m = document.getElementById('messages');
    new MutationObserver(() => {
      const r = m.querySelector('.msg.assistant:last-of-type');
      if (!r) return;
      const text = ['.content', '.thinking-text', '.tool-calls'].map((s) => r.querySelector(s)?.textContent || '').join('');
      window.__samples.push({ len: text.length, streaming: r.classList.contains('streaming') });
    }).observe(m, { childList: true, subtree: true, characterData: true, attributes: true });
  });
}

async function main() {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ft-web-profile-'));
  const ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.FT_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ARGS,
    timeout: 60_000,
    viewport: { width: 1280, height: 900 },
  });
  const errors = [];
  try {
    const page = ctx.pages()[0] || (await ctx.newPage());
    page.on('pageerror', (e) => errors.push(String(e)));
    page.setDefaultTimeout(30_000);

    // The page loads, with its assets, and the engine view fills from /v1/stats.
    const resp = await page.goto(`${base}/`, { waitUntil: 'load' });
    check(resp && resp.status() === 200, 'GET / answers 200', resp && resp.status());
    check((await page.title()) === 'ft-actor', 'the page has its title', await page.title());
    for (const id of ['prompt', 'send', 'stop', 'reset', 'messages', 'system', 'heatmap', 'stat-generated', 'stat-tps']) {
      check((await page.locator(`#${id}`).count()) === 1, `#${id} is on the page`);
    }
    await page.waitForFunction(() => document.getElementById('conn').textContent === 'live');
    check(true, 'the engine view polled /v1/stats');
    check((await page.textContent('#model')).includes('ft-actor-demo'), 'the header names the model', await page.textContent('#model'));
    const generatedBefore = num(await page.textContent('#stat-generated'));

    // A message streams a reply: its text grows while the reply is still streaming, then ends.
    // The demo model writes a reply faster than one network read takes, so the link is
    // throttled (16 KiB/s, about 50 events a second) for this reply: the page must then show
    // the text as its pieces arrive, whatever the engine's speed.
    const cdp = await ctx.newCDPSession(page);
    await cdp.send('Network.enable');
    const throttle = (bytesPerS) => cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: bytesPerS, uploadThroughput: -1 });
    await page.click('#settings summary');
    await page.fill('#max-tokens', '64');
    await record(page);
    await throttle(16 * 1024);
    await page.fill('#prompt', 'Hello! Tell me about mixtures of experts.');
    await page.click('#send');
    await page.waitForSelector('.msg.user');
    await page.waitForSelector('.msg.assistant.done', { timeout: 120_000 });
    await throttle(-1);
    const samples = await page.evaluate(() => window.__samples);
    const growing = [...new Set(samples.filter((s) => s.streaming && s.len > 0).map((s) => s.len))];
    check(growing.length >= 4, `the reply appeared in several steps while streaming (${growing.length})`, growing);
    const finalLen = samples.length ? samples[samples.length - 1].len : 0;
    check(finalLen > 0 && finalLen >= Math.max(...growing), 'the finished reply holds all the text', { finalLen, growing });
    const meta = await page.textContent('.msg.assistant .meta');
    check(/generated/.test(meta) && /finish: /.test(meta), 'the reply reports its usage and finish', meta);
    console.log(`  (${meta})`);
    check(await page.isEnabled('#send'), 'Send is enabled again');
    check(await page.isDisabled('#stop'), 'Stop is disabled again');

    // The engine view updates: more tokens generated, and the per-layer heatmap has data.
    await page.waitForFunction((before) => Number(document.getElementById('stat-generated').textContent.replace(/[^0-9]/g, '')) > before, generatedBefore, { timeout: 15_000 });
    const generatedAfter = num(await page.textContent('#stat-generated'));
    check(generatedAfter > generatedBefore, 'the tokens-generated figure went up', { generatedBefore, generatedAfter });
    await page.waitForFunction(() => Number(document.getElementById('heatmap').dataset.filled) > 0, null, { timeout: 15_000 });
    check(true, 'the heatmap shows per-layer expert lookups');
    check((await page.textContent('#stat-tps')) !== '–', 'the decode tokens/s figure is shown', await page.textContent('#stat-tps'));
    check((await page.textContent('#split')).includes('q*'), 'the q* split is shown');
    check(/GB\/s/.test(await page.textContent('#bandwidth')), 'the bandwidths are shown');
    if (process.env.FT_WEB_SCREENSHOT) await page.screenshot({ path: process.env.FT_WEB_SCREENSHOT, fullPage: true });

    // Stop ends a long reply early.
    await page.click('#reset');
    check((await page.locator('#messages > *').count()) === 0, 'Reset clears the conversation');
    await page.fill('#max-tokens', '900');
    await page.fill('#prompt', 'Write a long story.');
    // The demo model outruns a click from here, so the page clicks Stop itself on the
    // first text of the reply.
    await page.evaluate(() => {
      const m = document.getElementById('messages');
      const obs = new MutationObserver(() => {
        if (m.querySelector('.msg.assistant.streaming .content')?.textContent) {
          obs.disconnect();
          document.getElementById('stop').click();
        }
      });
      obs.observe(m, { childList: true, subtree: true, characterData: true });
    });
    await page.click('#send');
    await page.waitForSelector('.msg.assistant.stopped', { timeout: 30_000 });
    const stoppedMeta = await page.textContent('.msg.assistant .meta');
    check(stoppedMeta.includes('stopped'), 'Stop ends the reply and says so', stoppedMeta);
    check(await page.isEnabled('#send'), 'Send is enabled after Stop');

    // Thinking and tool calls, from a stream of the server's own shape (the demo model's
    // random weights cannot be made to produce them on demand).
    const chunk = (delta, finish = null) => `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const canned = [
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning_content: 'The user wants the weather; ' }),
      chunk({ reasoning_content: 'call the tool.' }),
      chunk({ content: 'Checking.' }),
      chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":' } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] }),
      chunk({}, 'tool_calls'),
      'data: [DONE]\n\n',
    ].join('');
    await page.route('**/v1/chat/completions', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream', body: canned }));
    await page.click('#reset');
    await page.fill('#prompt', 'Weather in Paris?');
    await page.click('#send');
    await page.waitForSelector('.msg.assistant.done');
    check((await page.textContent('.msg.assistant .thinking-text')) === 'The user wants the weather; call the tool.', 'thinking is shown in its own block');
    check(await page.isVisible('.msg.assistant .thinking summary'), 'the thinking block can be opened and closed');
    check((await page.textContent('.msg.assistant .tool-name')).includes('get_weather'), 'the tool call names its function');
    check((await page.textContent('.msg.assistant .tool-args')).includes('"city": "Paris"'), 'the tool call shows its arguments as formatted JSON');
    check((await page.textContent('.msg.assistant .content')) === 'Checking.', 'the answer text stays apart from thinking');
    await page.unroute('**/v1/chat/completions');

    check(errors.length === 0, 'no script errors on the page', errors);
    console.log(`web page: ${passed} checks passed`);
  } finally {
    await ctx.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
}

const guard = setTimeout(() => {
  console.error('FAILED: the browser test ran past 240 s');
  process.exit(2);
}, 240_000);
main().then(
  () => clearTimeout(guard),
  (e) => {
    console.error(e && e.stack ? e.stack : String(e));
    process.exit(1);
  },
);
