// The chat: one conversation held in the page, sent whole to /v1/chat/completions with
// `stream: true` and rendered delta by delta as the server-sent events arrive.

/** Reads a server-sent event stream from `body`, calling `onData` with each event's data. */
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    // Events end with a blank line; a partial one waits for the next read.
    let end;
    while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(buf.slice(end).match(/^\r?\n\r?\n/)[0].length + end);
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data && onData(data) === false) return;
    }
  }
}

/** The message text of an error response, whatever API shape it has. */
function errorText(status, body) {
  try {
    const v = JSON.parse(body);
    const e = v.error || v;
    return `${status}: ${e.message || JSON.stringify(e)}`;
  } catch {
    return `${status}: ${body || 'no body'}`;
  }
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** Pretty JSON when `s` parses as JSON, else `s` as it is. */
function pretty(s) {
  try {
    return JSON.stringify(JSON.parse(s), null, 2);
  } catch {
    return s;
  }
}

/** One assistant reply on screen, filled in as deltas arrive. */
class Reply {
  constructor(parent) {
    this.root = el('div', 'msg assistant streaming');
    this.root.append(el('div', 'role', 'assistant'));
    this.thinking = el('details', 'thinking');
    this.thinking.open = true;
    this.thinking.hidden = true;
    this.thinking.append(el('summary', null, 'Thinking'));
    this.thinkingText = el('div', 'thinking-text');
    this.thinking.append(this.thinkingText);
    this.content = el('div', 'content');
    this.calls = el('div', 'tool-calls');
    this.meta = el('div', 'meta');
    this.root.append(this.thinking, this.content, this.calls, this.meta);
    parent.append(this.root);
    this.text = '';
    this.reasoning = '';
    this.toolCalls = [];
  }

  addReasoning(t) {
    this.reasoning += t;
    this.thinking.hidden = false;
    this.thinkingText.textContent = this.reasoning;
  }

  addContent(t) {
    this.text += t;
    this.content.textContent = this.text;
  }

  /** Merges streamed `tool_calls` deltas: each names its call by `index`, and later deltas
   * of a call may carry more of its arguments. */
  addToolCalls(deltas) {
    for (const d of deltas) {
      const i = Number.isInteger(d.index) ? d.index : this.toolCalls.length;
      let c = this.toolCalls[i];
      if (!c) {
        c = this.toolCalls[i] = { id: d.id || `call_${i}`, type: 'function', function: { name: '', arguments: '' } };
        c.view = el('div', 'tool-call');
        c.nameView = el('div', 'tool-name');
        c.argsView = el('pre', 'tool-args');
        c.view.append(c.nameView, c.argsView);
        this.calls.append(c.view);
      }
      if (d.id) c.id = d.id;
      if (d.function?.name) c.function.name += d.function.name;
      if (d.function?.arguments) c.function.arguments += d.function.arguments;
      c.nameView.textContent = `tool call: ${c.function.name}`;
      c.argsView.textContent = pretty(c.function.arguments);
    }
  }

  finish(state, meta) {
    this.root.classList.remove('streaming');
    this.root.classList.add(state);
    if (this.reasoning && this.text) this.thinking.open = false;
    this.meta.textContent = meta;
  }

  /** The reply as a history message for the next request. */
  message() {
    const m = { role: 'assistant', content: this.text };
    if (this.reasoning) m.reasoning_content = this.reasoning;
    const calls = this.toolCalls.filter(Boolean);
    if (calls.length) {
      m.tool_calls = calls.map((c) => ({ id: c.id, type: 'function', function: { ...c.function } }));
      if (!this.text) m.content = null;
    }
    return m;
  }
}

/** The chat panel: `ui` holds its elements, `headers()` the request headers (API key). */
export class Chat {
  constructor(ui, headers) {
    this.ui = ui;
    this.headers = headers;
    this.history = [];
    this.abort = null;
    ui.composer.addEventListener('submit', (e) => {
      e.preventDefault();
      this.send();
    });
    ui.prompt.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    ui.stop.addEventListener('click', () => this.abort?.abort());
    ui.reset.addEventListener('click', () => this.reset());
  }

  reset() {
    this.abort?.abort();
    this.history = [];
    this.ui.messages.replaceChildren();
    this.ui.prompt.focus();
  }

  setBusy(busy) {
    this.ui.send.disabled = busy;
    this.ui.stop.disabled = !busy;
  }

  /** The request body for the conversation so far, or throws with what is wrong in the settings. */
  body() {
    const messages = [];
    const system = this.ui.system.value.trim();
    if (system) messages.push({ role: 'system', content: system });
    messages.push(...this.history);
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    const max = parseInt(this.ui.maxTokens.value, 10);
    if (max > 0) body.max_tokens = max;
    const temp = parseFloat(this.ui.temperature.value);
    if (Number.isFinite(temp)) body.temperature = temp;
    if (this.ui.thinking.value) body.chat_template_kwargs = { enable_thinking: this.ui.thinking.value === 'on' };
    const tools = this.ui.tools.value.trim();
    if (tools) {
      let parsed;
      try {
        parsed = JSON.parse(tools);
      } catch (e) {
        throw new Error(`the tools are not valid JSON: ${e.message}`);
      }
      if (!Array.isArray(parsed)) throw new Error('the tools must be a JSON array');
      body.tools = parsed;
    }
    return body;
  }

  async send() {
    const text = this.ui.prompt.value.trim();
    if (!text || this.abort) return;
    const user = el('div', 'msg user');
    user.append(el('div', 'role', 'user'), el('div', 'content', text));
    this.ui.messages.append(user);
    // A reset during the stream starts a new history; this turn's reply belongs to the old one.
    const history = this.history;
    history.push({ role: 'user', content: text });
    this.ui.prompt.value = '';
    const reply = new Reply(this.ui.messages);
    this.scroll();
    const abort = (this.abort = new AbortController());
    this.setBusy(true);
    const started = performance.now();
    let first = null;
    let usage = null;
    let finish = null;
    let failure = null;
    try {
      const resp = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...this.headers() },
        body: JSON.stringify(this.body()),
        signal: abort.signal,
      });
      if (!resp.ok) throw new Error(errorText(resp.status, await resp.text()));
      await readEvents(resp.body, (data) => {
        if (data === '[DONE]') return false;
        const v = JSON.parse(data);
        if (v.error) {
          failure = v.error.message || JSON.stringify(v.error);
          return false;
        }
        if (v.usage) usage = v.usage;
        for (const ch of v.choices || []) {
          const d = ch.delta || {};
          const reasoning = d.reasoning_content ?? d.reasoning;
          if (reasoning || d.content || d.tool_calls) first ??= performance.now();
          if (reasoning) reply.addReasoning(reasoning);
          if (d.content) reply.addContent(d.content);
          if (d.tool_calls) reply.addToolCalls(d.tool_calls);
          if (ch.finish_reason) finish = ch.finish_reason;
        }
        this.scroll();
        return true;
      });
    } catch (e) {
      failure = abort.signal.aborted ? null : e.message;
    }
    const end = performance.now();
    const parts = [];
    if (usage) {
      parts.push(`${usage.prompt_tokens} prompt tokens`);
      const cached = usage.prompt_tokens_details?.cached_tokens;
      if (cached) parts.push(`${cached} reused`);
      parts.push(`${usage.completion_tokens} generated`);
      if (first !== null && usage.completion_tokens > 1 && end > first) {
        parts.push(`${((usage.completion_tokens - 1) / ((end - first) / 1000)).toFixed(1)} tokens/s received`);
      }
    }
    if (first !== null) parts.push(`first token after ${((first - started) / 1000).toFixed(2)} s`);
    if (abort.signal.aborted) parts.push('stopped');
    else if (finish) parts.push(`finish: ${finish}`);
    if (failure) {
      reply.root.append(el('div', 'error', failure));
      reply.finish('error', parts.join(' · '));
    } else {
      reply.finish(abort.signal.aborted ? 'stopped' : 'done', parts.join(' · '));
    }
    // A stopped or failed reply stays in the history with what it had, so the next turn
    // sees what the reader saw.
    if (reply.text || reply.reasoning || reply.toolCalls.length) history.push(reply.message());
    this.abort = null;
    this.setBusy(false);
    this.scroll();
  }

  scroll() {
    const m = this.ui.messages;
    m.scrollTop = m.scrollHeight;
  }
}
