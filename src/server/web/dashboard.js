// The engine view: polls /v1/stats and shows its counters. Rates over an interval are the
// difference of two polls, since the endpoint reports totals since the engine started.

const HISTORY_ROWS = 40;

const fmt = {
  int: (n) => (n ?? 0).toLocaleString('en-US'),
  pct: (x) => (x === null || x === undefined ? '–' : `${(100 * x).toFixed(1)}%`),
  bytes(n) {
    if (!n) return '0 B';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
  rate: (b) => (b === null || b === undefined || !Number.isFinite(b) ? '–' : `${(b / 1e9).toFixed(2)} GB/s`),
  plural: (n, what) => `${(n ?? 0).toLocaleString('en-US')} ${what}${n === 1 ? '' : 's'}`,
  num: (x, d = 1) => (x === null || x === undefined ? '–' : x.toFixed(d)),
};

/** Hit rate as a colour from red (0) through yellow to green (1). */
function heatColor(r) {
  const hue = Math.round(120 * Math.max(0, Math.min(1, r)));
  return `hsl(${hue} 70% 45%)`;
}

function rows(table, entries) {
  table.replaceChildren(
    ...entries.map(([k, v, title]) => {
      const tr = document.createElement('tr');
      const th = document.createElement('th');
      th.textContent = k;
      if (title) th.title = title;
      const td = document.createElement('td');
      td.textContent = v;
      tr.append(th, td);
      return tr;
    }),
  );
}

export class Dashboard {
  constructor(ui, headers) {
    this.ui = ui;
    this.headers = headers;
    this.prev = null;
    this.history = [];
    this.last = null;
    this.tps = null;
    ui.heatmap.addEventListener('mousemove', (e) => this.hover(e));
    ui.heatmap.addEventListener('mouseleave', () => (ui.heatHover.textContent = ''));
    window.addEventListener('resize', () => this.draw());
  }

  /** Polls every `ms` milliseconds, one request at a time. */
  start(ms) {
    const tick = async () => {
      await this.poll();
      setTimeout(tick, ms);
    };
    tick();
  }

  async poll() {
    try {
      const resp = await fetch('/v1/stats', { headers: this.headers(), cache: 'no-store' });
      if (!resp.ok) {
        const hint = resp.status === 401 ? ' (set the API key in Settings)' : '';
        throw new Error(`/v1/stats answered ${resp.status}${hint}`);
      }
      const s = await resp.json();
      this.update(s);
      this.ui.conn.textContent = 'live';
      this.ui.conn.className = 'badge ok';
      this.ui.error.hidden = true;
    } catch (e) {
      this.ui.conn.textContent = 'offline';
      this.ui.conn.className = 'badge bad';
      this.ui.error.textContent = e.message;
      this.ui.error.hidden = false;
    }
  }

  update(s) {
    const p = this.prev;
    const ui = this.ui;
    ui.model.textContent = `${s.model} · ${s.backend}`;
    ui.updated.textContent = `updated ${new Date().toLocaleTimeString()}`;

    // Decode speed over the interval; it keeps the last figure while the engine is idle.
    if (p) {
      const dt = s.tokens.decode_seconds - p.tokens.decode_seconds;
      const dn = s.tokens.decode_tokens - p.tokens.decode_tokens;
      if (dt > 0 && dn > 0) this.tps = dn / dt;
    }
    ui.tps.textContent = this.tps === null ? '–' : this.tps.toFixed(1);
    ui.tpsAvg.textContent = `average ${fmt.num(s.tokens.decode_tokens_per_s)} · ${s.requests.running} running, ${s.requests.waiting} waiting`;
    ui.generated.textContent = fmt.int(s.tokens.generated);
    ui.requests.textContent = `${fmt.plural(s.requests.completed, 'request')} done · ${fmt.plural(s.tokens.prompt, 'prompt token')}`;

    const c = s.expert_cache;
    ui.hit.textContent = fmt.pct(c.hit_rate);
    ui.slots.textContent = `${fmt.int(c.used)} of ${fmt.int(c.slots)} slots used · ${fmt.int(c.evictions)} evictions`;
    // Without slots every lookup misses by construction: the map is all red for that reason.
    ui.heatNote.hidden = c.slots > 0;

    const pc = s.prefix_cache;
    ui.reuse.textContent = pc.enabled ? fmt.pct(pc.reused_fraction) : 'off';
    ui.reuseSub.textContent = `${fmt.int(pc.reused_tokens)} of ${fmt.int(pc.prompt_tokens)} prompt tokens · ${fmt.int(pc.hits)} hits, ${fmt.int(pc.misses)} misses`;

    this.pushHeat(s, p);
    this.draw();
    this.split(s);
    this.bandwidth(s);
    this.prefix(s);
    this.prev = s;
  }

  /** Adds a row of per-layer hit rates over the interval since the previous poll. */
  pushHeat(s, p) {
    const before = new Map((p?.expert_cache.layers || []).map((l) => [l.layer, l]));
    const row = s.expert_cache.layers.map((l) => {
      const b = before.get(l.layer) || { hits: 0, misses: 0 };
      const n = l.hits + l.misses - b.hits - b.misses;
      return n > 0 ? (l.hits - b.hits) / n : null;
    });
    if (p && row.some((r) => r !== null)) {
      this.history.push(row);
      if (this.history.length > HISTORY_ROWS) this.history.shift();
    }
    this.last = s.expert_cache.layers;
  }

  draw() {
    const canvas = this.ui.heatmap;
    const layers = this.last || [];
    const total = layers.map((l) => (l.hits + l.misses > 0 ? l.hits / (l.hits + l.misses) : null));
    const grid = [...this.history, total];
    canvas.dataset.filled = String(total.filter((r) => r !== null).length);
    canvas.dataset.rows = String(this.history.length);
    const width = canvas.clientWidth || 600;
    const cellH = 8;
    const height = Math.max(grid.length * cellH + 6, 40);
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = `${height}px`;
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    if (!layers.length) {
      g.fillStyle = '#888';
      g.fillText('no MoE layer has counted a lookup yet', 6, 16);
      return;
    }
    const cellW = width / layers.length;
    grid.forEach((row, y) => {
      // The since-start row sits apart from the history above it.
      const top = y === grid.length - 1 ? y * cellH + 6 : y * cellH;
      row.forEach((r, x) => {
        g.fillStyle = r === null ? '#8884' : heatColor(r);
        g.fillRect(x * cellW, top, Math.max(cellW - 1, 1), cellH - 1);
      });
    });
    this.geometry = { cellW, cellH, rows: grid.length };
  }

  hover(e) {
    const layers = this.last;
    if (!layers?.length || !this.geometry) return;
    const rect = this.ui.heatmap.getBoundingClientRect();
    const i = Math.floor((e.clientX - rect.left) / this.geometry.cellW);
    const l = layers[i];
    if (!l) return;
    const n = l.hits + l.misses;
    this.ui.heatHover.textContent =
      `layer ${l.layer}: ${fmt.pct(n ? l.hits / n : null)} of ${fmt.int(n)} lookups · ` +
      `${fmt.int(l.fetched)} fetched, ${fmt.int(l.cpu_computed)} on the CPU, ${fmt.int(l.streamed)} streamed`;
  }

  split(s) {
    const sp = s.split;
    const c = s.expert_cache;
    const misses = sp.fetched + sp.cpu_computed;
    const parts = [
      ['hit', c.hits, 'cached (device)'],
      ['fetch', sp.fetched, 'missed, fetched to the device'],
      ['cpu', sp.cpu_computed, 'missed, computed on the CPU'],
      ['stream', sp.streamed, 'streamed layer (prefill)'],
    ];
    const sum = parts.reduce((a, p) => a + p[1], 0);
    this.ui.splitBar.replaceChildren(
      ...parts
        .filter((p) => p[1] > 0)
        .map(([cls, n, label]) => {
          const d = document.createElement('span');
          d.className = cls;
          d.style.flexGrow = String(n);
          d.title = `${label}: ${fmt.int(n)} (${fmt.pct(n / sum)})`;
          return d;
        }),
    );
    rows(this.ui.split, [
      ['MoE mode', s.moe_mode],
      ['q* for top-k misses', `${fmt.num(sp.q_star_for_top_k_misses, 2)} of ${sp.experts_per_token} to fetch`, 'm·B_P/(B_P+B_H) with m = experts per token, from the bandwidths below'],
      ['misses fetched / on CPU', `${fmt.int(sp.fetched)} / ${fmt.int(sp.cpu_computed)}` + (misses ? ` (${fmt.pct(sp.fetched / misses)} fetched)` : ''), 'How the engine split the misses, since start'],
      ['cache hits / streamed', `${fmt.int(c.hits)} / ${fmt.int(sp.streamed)}`],
    ]);
  }

  bandwidth(s) {
    const b = s.bandwidth;
    rows(this.ui.bandwidth, [
      ['host → device (B_P)', fmt.rate(b.host_to_device_bytes_per_s), 'Copy bandwidth the miss split is priced with'],
      ['CPU expert rate (B_H)', fmt.rate(b.cpu_expert_bytes_per_s), 'Rate the CPU executors stream expert weights'],
      ['B_P, B_H from', b.source],
      ['decode weight reads', fmt.rate(b.decode_weight_bytes_per_s), 'Weight bytes decode steps read over their time, since start'],
      ['bytes fetched to device', `${fmt.bytes(b.bytes_moved)} (${fmt.num(b.fetch_wait_seconds, 2)} s waited)`],
    ]);
  }

  prefix(s) {
    const pc = s.prefix_cache;
    const kv = s.kv;
    const st = s.steps;
    rows(this.ui.prefix, [
      ['prefix cache', pc.enabled ? `${fmt.bytes(pc.bytes)} of ${fmt.bytes(pc.budget_bytes)} · ${fmt.int(pc.anchors)} anchors` : 'off'],
      ['resumed / fresh prompts', `${fmt.int(pc.hits)} / ${fmt.int(pc.misses)} · ${fmt.int(pc.evictions)} evicted`],
      ['prompt tokens prefilled', `${fmt.int(s.tokens.prefilled)} of ${fmt.int(s.tokens.prompt)}`],
      ['KV pool', `${fmt.bytes(kv.used_bytes)} of ${fmt.bytes(kv.pool_bytes)} · ${fmt.int(kv.waiting)} waiting`],
      ['steps', `${fmt.int(st.total)} · mean batch ${fmt.num(st.mean_batch, 2)} · max ${fmt.int(st.max_batch)}`],
      ['preemptions', fmt.int(st.preemptions)],
    ]);
  }
}
