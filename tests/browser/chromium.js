// Launches Debian's /usr/bin/chromium through playwright-core (never a downloaded browser)
// with the flags a closed network needs: without --disable-background-networking and its
// companions Chromium's own connections are refused here and slow every page.
import { existsSync } from 'node:fs';

let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (e) {
  throw new Error(
    `playwright-core is not installed in tests/browser (${e.message}): run \`npm ci --prefix tests/browser\``,
  );
}

export const CHROMIUM = process.env.GPUSLICE_CHROMIUM || '/usr/bin/chromium';

/**
 * A fresh headless Chromium. playwright-core gives it a new temporary profile directory
 * (its own --user-data-dir, removed on close; it refuses one passed in args), and each
 * `browser.newContext()` is a fresh, cache-less session on top.
 */
export async function launch() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `${CHROMIUM} is missing: install Debian's chromium (scripts/install-deps.sh does: apt-get install chromium)`,
    );
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
