// Drives headless Chromium (Debian's, never a downloaded one) with playwright-core: opens the
// page at argv[2], calls window.runTest(JSON argv[3]) and prints its result as one JSON line.
// argv[4]: SPKI pins (base64 SHA-256) of the test certificates Chromium is to trust.
import { chromium } from "playwright-core";

const [pageUrl, cfgJson, spki] = process.argv.slice(2);
const args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"];
if (spki) args.push(`--ignore-certificate-errors-spki-list=${spki}`);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
                                        headless: true, args });
try {
  const page = await browser.newPage();
  page.on("console", (m) => console.error(`page: ${m.text()}`));
  page.on("pageerror", (e) => console.error(`page error: ${e}`));
  await page.goto(pageUrl);
  const result = await page.evaluate((cfg) => window.runTest(cfg), JSON.parse(cfgJson));
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
