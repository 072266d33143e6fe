// Wires the chat and the engine view to the page's elements.

import { Chat } from './chat.js';
import { Dashboard } from './dashboard.js';

const $ = (id) => document.getElementById(id);

// The key lives in this tab's session storage only, never in the page's URL.
const keyInput = $('api-key');
keyInput.value = sessionStorage.getItem('ft-api-key') || '';
keyInput.addEventListener('change', () => sessionStorage.setItem('ft-api-key', keyInput.value.trim()));
const headers = () => {
  const k = keyInput.value.trim();
  return k ? { authorization: `Bearer ${k}` } : {};
};

new Chat(
  {
    composer: $('composer'),
    prompt: $('prompt'),
    send: $('send'),
    stop: $('stop'),
    reset: $('reset'),
    messages: $('messages'),
    system: $('system'),
    maxTokens: $('max-tokens'),
    temperature: $('temperature'),
    thinking: $('thinking'),
    tools: $('tools'),
  },
  headers,
);

new Dashboard(
  {
    conn: $('conn'),
    model: $('model'),
    updated: $('updated'),
    error: $('dash-error'),
    tps: $('stat-tps'),
    tpsAvg: $('stat-tps-avg'),
    generated: $('stat-generated'),
    requests: $('stat-requests'),
    hit: $('stat-hit'),
    slots: $('stat-slots'),
    reuse: $('stat-reuse'),
    reuseSub: $('stat-reuse-sub'),
    heatmap: $('heatmap'),
    heatHover: $('heat-hover'),
    heatNote: $('heat-note'),
    splitBar: $('split-bar'),
    split: $('split'),
    bandwidth: $('bandwidth'),
    prefix: $('prefix'),
  },
  headers,
).start(1000);

$('prompt').focus();
