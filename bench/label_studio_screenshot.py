"""A screenshot of a pair on Label Studio's labelling page, as a labeller sees it (the README's
and docs/retraining.md's picture): logs in with a user's email and password in headless
Chromium (Debian's `chromium`, driven by Playwright's Python package, no browser download),
opens the task's page and saves a PNG.

    pip install playwright            # the driver only; the browser is the system's
    LABEL_STUDIO_URL=http://127.0.0.1:8080 LS_EMAIL=you@example.com LS_PASSWORD=... \\
        python bench/label_studio_screenshot.py --project 1 --task 3 \\
        --out docs/img/label-studio-task.png
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=int, required=True)
    ap.add_argument("--task", type=int, required=True)
    ap.add_argument("--out", default="docs/img/label-studio-task.png")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    url = os.environ["LABEL_STUDIO_URL"].rstrip("/")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        page.goto(f"{url}/user/login/")
        page.fill("input[name=email]", os.environ["LS_EMAIL"])
        page.fill("input[name=password]", os.environ["LS_PASSWORD"])
        page.click("button[type=submit]")
        page.wait_for_load_state("networkidle")
        page.goto(f"{url}/projects/{args.project}/data?tab=0&task={args.task}")
        page.wait_for_selector("text=Response A", timeout=60000)
        page.wait_for_timeout(1500)
        page.screenshot(path=args.out)
        browser.close()
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
