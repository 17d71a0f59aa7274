// The browser test of `gpuslice console` (tests/tests/console_web.rs runs it): visits each
// page in headless Chromium, compares what it shows with the figures the Rust test computed
// from the API server and the exporters (never from the console), drives the GPU tab's forms,
// takes screenshots, and exits non-zero with one clear message at the first mismatch.
//
//   node tests/browser/console.js SPEC.json
//
// SPEC: {
//   url: "http://127.0.0.1:PORT",           the console
//   screenshots: DIR,                        optional: PNGs written there
//   mode: "edit allowed" | "read-only",      what <p id="mode"> says
//   rights: TEXT,                            <p id="rights"> contains it (context or user)
//   prometheus?: URL,                        the Prometheus the console reads (charts are
//                                            compared with its range queries)
//   pages: [{ path, name, table?, key?, rows?, exact?, first?, links?, missing?, absent?,
//             sparklines?, charts?, sliceMaps?, status?, contains?, screenshot?, width? }],
//            (missing: div.source-missing data-source values that must be there, absent:
//            ones that must not; charts: [{ selector, query, minPoints? }] covering every
//            svg.chart and svg.sparkline of the page: each one's data-values must equal the
//            range query `query` over its data-start, data-end and data-step (series summed
//            per time), and its polyline must draw exactly those points; sliceMaps:
//            { UUID: { memory: CAPACITY, segments: [{ claim, pod, booked }] } }: the node
//            page's memory bar of that GPU has exactly these segments, each as wide as its
//            share of the capacity and linked to its pod's row; width: the viewport width)
//   filter?: { available: [NODE…] },         a#filter-available on / keeps exactly these
//   steps?: [{ do: "allocate"|"release"|"read-only", workload: "NS/KIND/NAME", … }]
//            (allocate: form?: "limits"|"claim" chosen in the form's select, default its own;
//            budget?: a cell expectation of the GPU tab's #budget text; gpusMax?: the gpus
//            input's max, what the namespace's GPU budget leaves per pod)
// }
// A cell's expectation: a number (the cell's data-value, or its text when it has none),
// null (unknown: text `—`, no data-value), a string (the text), or
// { approx: N, tol: T } / { contains: [TEXT…] } / { not: TEXT } / { share: PERCENT } (its
// budget bar's data-share), which may be combined with { value: N }.
import { readFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { launch } from './chromium.js';

const UNKNOWN = '—';

class Mismatch extends Error {}

function fail(where, message) {
  throw new Mismatch(`${where}: ${message}`);
}

function checkCell(where, want, cell) {
  if (cell === undefined) fail(where, `no cell (want ${JSON.stringify(want)})`);
  const { text, value } = cell;
  if (want === null) {
    if (text !== UNKNOWN || value !== null) {
      fail(where, `want unknown (\`${UNKNOWN}\`, no data-value), got text ${JSON.stringify(text)} data-value ${JSON.stringify(value)}`);
    }
    return;
  }
  if (typeof want === 'number') {
    const got = value !== null ? Number(value) : Number.parseInt(text, 10);
    if (got !== want || text === UNKNOWN) {
      fail(where, `want ${want}, got data-value ${JSON.stringify(value)} text ${JSON.stringify(text)}`);
    }
    return;
  }
  if (typeof want === 'string') {
    if (text !== want) fail(where, `want text ${JSON.stringify(want)}, got ${JSON.stringify(text)}`);
    return;
  }
  if (want.measured !== undefined) {
    // A measured column: its value is the last point of its own sparkline (which the charts
    // check compares with Prometheus's range query `want.measured`), and not nothing.
    if (value === null || cell.last === null) fail(where, `want a measured value with its sparkline (${want.measured}), got text ${JSON.stringify(text)} data-value ${JSON.stringify(value)}`);
    const scale = where.endsWith('col cpu') ? 1000 : 1;
    if (Number(value) !== Math.round(Math.max(cell.last, 0) * scale)) fail(where, `data-value ${value} is not the sparkline's last point ${cell.last}`);
    if (!where.endsWith('col cpu') && !(Number(value) > 0)) fail(where, `a working set of ${value} bytes`);
    return;
  }
  if (want.approx !== undefined) {
    const got = Number(value);
    if (value === null || Math.abs(got - want.approx) > (want.tol ?? 0)) {
      fail(where, `want ${want.approx} ± ${want.tol ?? 0}, got data-value ${JSON.stringify(value)} text ${JSON.stringify(text)}`);
    }
  }
  for (const part of want.contains ?? []) {
    if (!text.includes(part)) fail(where, `want text containing ${JSON.stringify(part)}, got ${JSON.stringify(text)}`);
  }
  if (want.not !== undefined && text === want.not) fail(where, `want text other than ${JSON.stringify(want.not)}`);
  if (want.share !== undefined && cell.share !== want.share) fail(where, `want a budget bar of ${want.share}%, got ${JSON.stringify(cell.share)}`);
  if (want.text !== undefined && text !== want.text) fail(where, `want text ${JSON.stringify(want.text)}, got ${JSON.stringify(text)}`);
  if (want.value !== undefined && value !== String(want.value)) {
    fail(where, `want data-value ${want.value}, got ${JSON.stringify(value)}`);
  }
}

/** What every page carries: title, nav, rights, mode. */
async function checkFrame(page, where, spec, name) {
  const title = await page.title();
  if (!title.startsWith(name)) fail(where, `<title> ${JSON.stringify(title)} does not start with ${JSON.stringify(name)}`);
  for (const [href, label] of [['/', 'Nodes'], ['/pods', 'Pods'], ['/idle', 'Idle'], ['/workloads', 'Workloads'], ['/budgets', 'Budgets']]) {
    const link = page.locator(`nav a[href="${href}"]`);
    if ((await link.count()) !== 1) fail(where, `<nav> has no single a[href="${href}"]`);
    const text = (await link.textContent()).trim();
    if (!text.includes(label)) fail(where, `nav link ${href} reads ${JSON.stringify(text)}, not ${label}`);
  }
  const rights = await page.locator('p#rights').textContent().catch(() => null);
  if (rights === null) fail(where, 'no <p id="rights">');
  if (spec.rights && !rights.includes(spec.rights)) {
    fail(where, `<p id="rights"> ${JSON.stringify(rights)} does not name ${JSON.stringify(spec.rights)}`);
  }
  const mode = await page.locator('p#mode').textContent().catch(() => null);
  if (mode === null || !mode.includes(spec.mode)) fail(where, `<p id="mode"> ${JSON.stringify(mode)} does not say ${spec.mode}`);
}

/** The source-missing banners, as a sorted list of data-source; each with a sentence. */
async function banners(page) {
  const all = await page.$$eval('div.source-missing', (ds) => ds.map((d) => [d.dataset.source, d.textContent.trim()]));
  return all;
}

async function checkBanners(page, where, must, mustNot) {
  const got = await banners(page);
  const sources = got.map(([s]) => s);
  for (const w of must) if (!sources.includes(w)) fail(where, `no div.source-missing[data-source="${w}"] (banners: ${JSON.stringify(got)})`);
  for (const w of mustNot) if (sources.includes(w)) fail(where, `a div.source-missing[data-source="${w}"] although that source is there: ${JSON.stringify(got)}`);
  for (const [s, text] of got) if (text.length < 10) fail(where, `banner ${s} has no sentence: ${JSON.stringify(text)}`);
}

/** The rows of table#id keyed by the given attributes (joined by a space), in page order. */
async function rows(page, id, keys) {
  return page.$$eval(
    `table#${id} tr`,
    (trs, keys) =>
      trs
        .filter((tr) => keys.every((k) => tr.hasAttribute(k)))
        .map((tr) => {
          const cells = {};
          for (const td of tr.querySelectorAll('[data-col]')) {
            // A value cell of the lists: its value is in span.v (beside its bar and sparkline).
            const v = td.querySelector(':scope > span.v');
            const spark = (td.querySelector('svg.sparkline')?.getAttribute('data-values') ?? '').split(' ').filter((x) => x);
            const last = spark.length ? Number(spark[spark.length - 1].split(':')[1]) : null;
            // A budget's bar: its share of the hard value (or a queue's nominal quota), percent.
            const bar = td.querySelector('span.budget-bar');
            const share = bar ? Number(bar.dataset.share) : null;
            cells[td.dataset.col] = { text: (v ?? td).textContent.trim(), value: td.getAttribute('data-value'), last, share };
          }
          return {
            key: keys.map((k) => tr.getAttribute(k)).join(' '),
            cells,
            sparklines: tr.querySelectorAll('svg.sparkline').length,
            sparklinePoints: [...tr.querySelectorAll('svg.sparkline')].map((s) => s.getAttribute('data-points')),
            links: [...tr.querySelectorAll('a[href]')].map((a) => a.getAttribute('href')),
          };
        }),
    keys,
  );
}

async function shot(page, spec, name) {
  if (!spec.screenshots || !name) return;
  mkdirSync(spec.screenshots, { recursive: true });
  await page.screenshot({ path: join(spec.screenshots, name), fullPage: true });
}

async function visit(page, spec, path, status = 200) {
  const where = `GET ${path}`;
  const response = await page.goto(new URL(path, spec.url).href, { waitUntil: 'load' });
  if (response === null) fail(where, 'no response');
  if (response.status() !== status) fail(where, `status ${response.status()}, want ${status}: ${(await page.textContent('body')).slice(0, 300)}`);
  const headers = response.headers();
  const csp = headers['content-security-policy'] ?? '';
  if (!csp.includes("default-src 'none'") || !csp.includes("frame-ancestors 'none'")) {
    fail(where, `Content-Security-Policy ${JSON.stringify(csp)}`);
  }
  return where;
}

async function checkPage(page, spec, p) {
  const where = await visit(page, spec, p.path, p.status ?? 200);
  if (p.contains) {
    const body = await page.textContent('body');
    for (const c of p.contains) if (!body.includes(c)) fail(where, `page does not say ${JSON.stringify(c)}: ${body.slice(0, 400)}`);
  }
  if ((p.status ?? 200) !== 200) return;
  await checkFrame(page, where, spec, p.name);
  await checkBanners(page, where, p.missing ?? [], p.absent ?? []);
  if (p.table) {
    const keys = Array.isArray(p.key) ? p.key : [p.key];
    const got = await rows(page, p.table, keys);
    if (got.length === 0 && Object.keys(p.rows ?? {}).length > 0) fail(where, `table#${p.table} has no rows with ${keys.join(', ')}`);
    const byKey = new Map();
    for (const r of got) {
      if (byKey.has(r.key)) fail(where, `table#${p.table}: row ${r.key} twice`);
      byKey.set(r.key, r);
    }
    if (p.first !== undefined && got[0]?.key !== p.first) fail(where, `table#${p.table}: first row ${got[0]?.key}, want ${p.first}`);
    if (p.exact) {
      const want = Object.keys(p.rows).sort();
      const have = [...byKey.keys()].sort();
      if (JSON.stringify(want) !== JSON.stringify(have)) fail(where, `table#${p.table}: rows ${JSON.stringify(have)}, want ${JSON.stringify(want)}`);
    }
    for (const [key, cols] of Object.entries(p.rows ?? {})) {
      const r = byKey.get(key);
      if (!r) fail(where, `table#${p.table}: no row ${key} (rows: ${[...byKey.keys()].join(', ')})`);
      for (const [col, want] of Object.entries(cols)) checkCell(`${where} table#${p.table} row ${key} col ${col}`, want, r.cells[col]);
      if (p.sparklines !== undefined && key !== '(total)') {
        if (p.sparklines && r.sparklines < 1) fail(where, `row ${key}: no svg.sparkline (Prometheus is configured)`);
        if (!p.sparklines && r.sparklines > 0) fail(where, `row ${key}: a svg.sparkline although Prometheus is missing`);
        if (p.sparklines && r.sparklinePoints.some((n) => !(Number(n) >= 1))) fail(where, `row ${key}: sparkline data-points ${r.sparklinePoints}`);
      }
      for (const href of p.links?.[key] ?? []) if (!r.links.includes(href)) fail(where, `row ${key}: no link to ${href} (links: ${r.links})`);
    }
  }
  if (p.charts !== undefined) await checkCharts(page, where, p.charts);
  for (const [uuid, want] of Object.entries(p.sliceMaps ?? {})) await checkSliceMap(page, where, uuid, want);
  const noData = await page.$$eval('.no-data', (els) => els.map((e) => e.textContent.trim()));
  for (const t of noData) if (!t.startsWith('no data yet')) fail(where, `a .no-data element reads ${JSON.stringify(t)}`);
  if (p.width) {
    await page.setViewportSize({ width: p.width, height: 900 });
    const over = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    if (over > 0) fail(where, `at ${p.width} px the page is ${over} px wider than the window`);
  }
  await shot(page, spec, p.screenshot);
  if (p.width) await page.setViewportSize({ width: 1400, height: 900 });
}

/** Prometheus's range query `query` over the chart's span: [[t, v]…], series summed per time. */
async function rangeQuery(query, start, end, step) {
  const url = `${spec.prometheus}/api/v1/query_range?query=${encodeURIComponent(query)}&start=${start}&end=${end}&step=${step}`;
  const answer = await (await fetch(url)).json();
  if (answer.status !== 'success') throw new Mismatch(`Prometheus ${url}: ${JSON.stringify(answer)}`);
  const sums = new Map();
  for (const s of answer.data.result) for (const [t, v] of s.values) sums.set(t, (sums.get(t) ?? 0) + Number(v));
  return [...sums.entries()].sort((a, b) => a[0] - b[0]);
}

async function checkCharts(page, where, charts) {
  const all = await page.$$eval('svg.chart, svg.sparkline', (els) => els.length);
  if (all !== charts.length) fail(where, `${all} chart(s) on the page, the test expects ${charts.length}: ${JSON.stringify(charts.map((c) => c.selector))}`);
  for (const c of charts) {
    const got = await page.$$eval(c.selector, (els) =>
      els.map((e) => ({
        start: e.getAttribute('data-start'),
        end: e.getAttribute('data-end'),
        step: e.getAttribute('data-step'),
        top: Number(e.getAttribute('data-top')),
        values: (e.getAttribute('data-values') ?? '').split(' ').filter((x) => x).map((x) => x.split(':').map(Number)),
        line: (e.querySelector('polyline')?.getAttribute('points') ?? '').split(' ').filter((x) => x).map((x) => x.split(',').map(Number)),
        box: e.getAttribute('viewBox'),
        labels: e.querySelectorAll('text.axis-label').length,
        titles: [...e.querySelectorAll('text.axis-title')].map((t) => t.textContent),
        chart: e.classList.contains('chart'),
      })),
    );
    if (got.length !== 1) fail(where, `${got.length} elements match ${c.selector}, want 1`);
    const [g] = got;
    const w = `${where} ${c.selector}`;
    const want = await rangeQuery(c.query, g.start, g.end, g.step);
    if (want.length < (c.minPoints ?? 1)) fail(w, `the range query ${c.query} has ${want.length} point(s), the test wants at least ${c.minPoints ?? 1} (history)`);
    if (JSON.stringify(g.values) !== JSON.stringify(want)) {
      fail(w, `plotted points ${JSON.stringify(g.values)} differ from the range query ${c.query} over ${g.start}..${g.end} step ${g.step}: ${JSON.stringify(want)}`);
    }
    if (g.line.length !== want.length) fail(w, `the polyline draws ${g.line.length} points, the data ${want.length}`);
    // Each drawn y is the value's height in the plot (higher value, smaller y), where the
    // change is large enough to show at the drawn precision (0.01 of a unit of the box).
    const boxH = Number((g.box ?? '0 0 0 0').split(' ')[3]);
    for (let i = 1; i < want.length; i += 1) {
      const dv = want[i][1] - want[i - 1][1];
      const dy = g.line[i][1] - g.line[i - 1][1];
      const visible = (Math.abs(dv) / g.top) * boxH > 0.1;
      if ((visible && dv > 0 && !(dy < 0)) || (visible && dv < 0 && !(dy > 0)) || (dv === 0 && Math.abs(dy) > 0.01)) {
        fail(w, `point ${i}: value ${want[i - 1][1]} -> ${want[i][1]} drawn from y ${g.line[i - 1][1]} to ${g.line[i][1]}`);
      }
    }
    if (g.chart) {
      if (g.labels < 6) fail(w, `${g.labels} axis labels, want values and times on both axes`);
      if (!g.titles.some((t) => t.includes('time')) || !g.titles.some((t) => /\((bytes|CPU cores)\)/.test(t))) {
        fail(w, `axis titles ${JSON.stringify(g.titles)} do not name time and the unit`);
      }
    }
  }
}

async function checkSliceMap(page, where, uuid, want) {
  const w = `${where} slice map of ${uuid}`;
  const got = await page.$$eval(`div.gpu-map[data-gpu="${uuid}"] .slice-map[data-resource="memory"]`, (maps) =>
    maps.map((m) => ({
      capacity: Number(m.dataset.capacity),
      inner: m.clientWidth,
      segments: [...m.querySelectorAll('a.segment')].map((a) => ({
        claim: a.dataset.claim,
        pod: a.dataset.pod,
        booked: Number(a.dataset.booked),
        href: a.getAttribute('href'),
        width: a.getBoundingClientRect().width,
      })),
      free: m.querySelector('.free')?.getBoundingClientRect().width ?? 0,
    })),
  );
  if (got.length !== 1) fail(w, `${got.length} memory bars, want 1`);
  const [m] = got;
  if (m.capacity !== want.memory) fail(w, `capacity ${m.capacity}, want ${want.memory}`);
  const key = (s) => `${s.claim} ${s.pod} ${s.booked}`;
  const have = m.segments.map(key).sort();
  const expect = want.segments.map(key).sort();
  if (JSON.stringify(have) !== JSON.stringify(expect)) fail(w, `segments ${JSON.stringify(have)}, want ${JSON.stringify(expect)}`);
  let booked = 0;
  for (const s of m.segments) {
    booked += s.booked;
    const px = (s.booked / m.capacity) * m.inner;
    if (Math.abs(s.width - px) > 1.5) fail(w, `segment ${s.claim}: ${s.width.toFixed(1)} px wide, its booking ${s.booked} of ${m.capacity} is ${px.toFixed(1)} px of ${m.inner}`);
    const ns = s.claim.split('/')[0];
    const href = `/pods?namespace=${ns}#pod-${ns}-${s.pod}`;
    if (s.href !== href) fail(w, `segment ${s.claim} links to ${s.href}, want its pod's row ${href}`);
  }
  const freePx = ((m.capacity - booked) / m.capacity) * m.inner;
  if (Math.abs(m.free - freePx) > 1.5) fail(w, `the free part is ${m.free.toFixed(1)} px, want ${freePx.toFixed(1)}`);
}

async function checkFilter(page, spec) {
  const where = 'GET / then a#filter-available';
  await visit(page, spec, '/');
  await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click('a#filter-available')]);
  if (!page.url().includes('available=1')) fail(where, `the filter led to ${page.url()}, not ?available=1`);
  const got = (await rows(page, 'nodes', ['data-node'])).map((r) => r.key).filter((k) => k !== '(total)').sort();
  const want = [...spec.filter.available].sort();
  if (JSON.stringify(got) !== JSON.stringify(want)) fail(where, `nodes ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  await shot(page, spec, spec.filter.screenshot);
  await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click('a#filter-available')]);
  if (page.url().includes('available=1')) fail(where, `the filter does not toggle back: ${page.url()}`);
}

async function resultOf(page, where, step, response) {
  const result = page.locator('div#result');
  if ((await result.count()) !== 1) fail(where, `no div#result: ${(await page.textContent('body')).slice(0, 400)}`);
  const cls = await result.getAttribute('class');
  const text = (await result.textContent()).trim();
  if (!cls.split(/\s+/).includes(step.expect)) fail(where, `div#result is ${cls} (${JSON.stringify(text)}), want ${step.expect}`);
  const status = response.status();
  if (step.expect === 'ok' && status !== 200) fail(where, `status ${status} for a success`);
  if (step.expect === 'error' && (status < 400 || status > 499)) fail(where, `status ${status} for a refusal, want 4xx`);
  for (const c of step.resultContains ?? []) if (!text.includes(c)) fail(where, `div#result ${JSON.stringify(text)} does not contain ${JSON.stringify(c)}`);
  if (step.diffContains) {
    const diff = await page.locator('pre#diff').textContent().catch(() => null);
    if (diff === null) fail(where, 'no pre#diff for a dry run');
    for (const c of step.diffContains) if (!diff.includes(c)) fail(where, `pre#diff does not contain ${JSON.stringify(c)}:\n${diff}`);
  } else if (step.expect === 'ok' && (await page.locator('pre#diff').count()) > 0 && !step.dryRun) {
    fail(where, 'a pre#diff without dry run');
  }
  await shot(page, spec, step.screenshot);
}

let spec;

async function workloadTab(page, step) {
  const where = await visit(page, spec, `/workloads/${step.workload}`);
  await checkFrame(page, where, spec, step.name ?? 'Workload');
  if ((await page.locator('section#gpu-tab').count()) !== 1) fail(where, 'no section#gpu-tab');
  const current = (await page.locator('p#current-slice').textContent().catch(() => null))?.trim();
  if (current === undefined) fail(where, 'no p#current-slice');
  if (step.current !== undefined) checkCell(`${where} p#current-slice`, step.current, { text: current, value: null });
  if (step.budget !== undefined) {
    // What the namespace's budget leaves, said beside the form before it is sent.
    const budget = (await page.locator('#budget').textContent().catch(() => null))?.trim();
    if (budget === undefined) fail(where, 'no #budget on the GPU tab');
    checkCell(`${where} #budget`, step.budget, { text: budget, value: null });
  }
  return where;
}

async function allocate(page, step) {
  const where = await workloadTab(page, step);
  const form = page.locator('form#allocate');
  if ((await form.count()) !== 1) fail(where, 'no form#allocate with --allow-edit');
  const action = await form.getAttribute('action');
  if (action !== `/workloads/${step.workload}/allocate`) fail(where, `form#allocate action ${action}`);
  if ((await form.getAttribute('method'))?.toLowerCase() !== 'post') fail(where, 'form#allocate is not POST');
  const button = (await page.locator('button#allocate-submit').textContent()).trim();
  if (step.button && button !== step.button) fail(where, `button#allocate-submit reads ${JSON.stringify(button)}, want ${step.button}`);
  if (step.gpusMax !== undefined) {
    // The browser itself refuses more GPUs per pod than the namespace's GPU budget leaves.
    const max = await form.locator('input[name="gpus"]').getAttribute('max');
    if (max !== String(step.gpusMax)) fail(where, `input gpus max ${JSON.stringify(max)}, want ${step.gpusMax}`);
  }
  if (step.defaultGpus !== undefined) {
    const v = await form.locator('input[name="gpus"]').inputValue();
    if (v !== String(step.defaultGpus)) fail(where, `input gpus defaults to ${JSON.stringify(v)}, want ${step.defaultGpus}`);
  }
  if (step.releaseForm !== undefined) {
    const n = await page.locator('form#release button#release-submit').count();
    if (n !== (step.releaseForm ? 1 : 0)) fail(where, `form#release with button#release-submit: ${n}, want ${step.releaseForm ? 1 : 0}`);
  }
  await form.locator('input[name="gpus"]').fill(String(step.gpus));
  await form.locator('input[name="memory"]').fill(step.memory);
  await form.locator('input[name="cores"]').fill(step.cores ?? '');
  await form.locator('input[name="dry_run"]').setChecked(Boolean(step.dryRun));
  // The form choice: a select offering the workload's own form (empty value), limits and claim.
  const choice = form.locator('select[name="form"]');
  if ((await choice.count()) !== 1) fail(where, 'no select[name="form"] in form#allocate');
  const offered = await choice.locator('option').evaluateAll((os) => os.map((o) => o.value));
  if (JSON.stringify(offered) !== JSON.stringify(['', 'limits', 'claim'])) fail(where, `select form offers ${JSON.stringify(offered)}, want ["","limits","claim"]`);
  await choice.selectOption(step.form ?? '');
  await shot(page, spec, step.formScreenshot);
  const [response] = await Promise.all([
    page.waitForNavigation({ waitUntil: 'load' }),
    page.click('button#allocate-submit'),
  ]);
  await resultOf(page, `${where} allocate ${JSON.stringify(step)}`, step, response);
}

async function release(page, step) {
  const where = await workloadTab(page, step);
  if ((await page.locator('form#release').count()) !== 1) fail(where, 'no form#release on a workload with a slice');
  const [response] = await Promise.all([
    page.waitForNavigation({ waitUntil: 'load' }),
    page.click('button#release-submit'),
  ]);
  await resultOf(page, `${where} release`, step, response);
}

async function readOnly(page, step) {
  const where = await workloadTab(page, step);
  const forms = await page.locator('form').count();
  if (forms !== 0) fail(where, `${forms} form(s) on a read-only console`);
  const body = await page.textContent('body');
  const says = 'read-only: start gpuslice console with --allow-edit to allocate';
  if (!body.includes(says)) fail(where, `the page does not say ${JSON.stringify(says)}`);
  await shot(page, spec, step.screenshot);
}

async function main() {
  if (process.argv.length !== 3) throw new Mismatch('usage: node tests/browser/console.js SPEC.json');
  spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
  const browser = await launch();
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    for (const p of spec.pages ?? []) await checkPage(page, spec, p);
    if (spec.filter) await checkFilter(page, spec);
    for (const step of spec.steps ?? []) {
      if (step.do === 'allocate') await allocate(page, step);
      else if (step.do === 'release') await release(page, step);
      else if (step.do === 'read-only') await readOnly(page, step);
      else throw new Mismatch(`unknown step ${JSON.stringify(step)}`);
    }
    console.log(`console.js: ${spec.url}: ${(spec.pages ?? []).length} page(s), ${(spec.steps ?? []).length} step(s): all as expected`);
  } finally {
    await browser.close();
  }
}

try {
  await main();
} catch (e) {
  console.error(`console.js: ${e instanceof Mismatch ? '' : 'error: '}${e.message}`);
  process.exit(1);
}
