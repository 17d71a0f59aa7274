// First page load of the console in headless Chromium (scripts/bench-console.sh runs it):
// RUNS fresh browser contexts (no cache, no cookies) each load PATH once; the figure is the
// navigation's start to its load event (Navigation Timing's loadEventEnd). Checks the page
// holds the expected number of node rows, so a fast error page cannot pass as a load.
//
//   node tests/browser/bench.js URL RUNS NODE_ROWS [PATH]
//
// Prints one JSON line: {"runs":N,"ms":[…],"min":…,"median":…,"max":…}.
import { launch } from './chromium.js';

const [url, runsArg, rowsArg, path = '/'] = process.argv.slice(2);
const runs = Number(runsArg);
const want = Number(rowsArg);
if (!url || !(runs >= 1) || !(want >= 0)) {
  console.error('usage: node tests/browser/bench.js URL RUNS NODE_ROWS [PATH]');
  process.exit(2);
}

const browser = await launch();
const ms = [];
try {
  // One load to start the browser's own machinery (not counted: it is Chromium's, not the page's).
  const warm = await browser.newContext();
  await (await warm.newPage()).goto('about:blank');
  await warm.close();
  for (let i = 0; i < runs; i++) {
    const context = await browser.newContext();
    const page = await context.newPage();
    const response = await page.goto(new URL(path, url).href, { waitUntil: 'load' });
    if (!response || response.status() !== 200) {
      throw new Error(`GET ${path}: status ${response?.status()}`);
    }
    const t = await page.evaluate(() => {
      const [n] = performance.getEntriesByType('navigation');
      return n.loadEventEnd - n.startTime;
    });
    const rows = await page.locator('table#nodes tr[data-node]:not([data-node="(total)"])').count();
    if (rows !== want) throw new Error(`GET ${path}: table#nodes has ${rows} node rows, want ${want}`);
    ms.push(t);
    await context.close();
  }
} catch (e) {
  console.error(`bench.js: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
if (process.exitCode !== 1) {
  const sorted = [...ms].sort((a, b) => a - b);
  const mid = sorted.length / 2;
  const median = sorted.length % 2 ? sorted[Math.floor(mid)] : (sorted[mid - 1] + sorted[mid]) / 2;
  const r = (x) => Math.round(x * 10) / 10;
  console.log(JSON.stringify({ runs, ms: ms.map(r), min: r(sorted[0]), median: r(median), max: r(sorted.at(-1)) }));
}
