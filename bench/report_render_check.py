"""Render an internal report the way its reader sees it, and check that it opens with the summary.

Headless Chromium (Debian's `chromium`; `apt-get install chromium`) renders REPORT.html at 1400 x 900 px:

* `first_screen.png`: a screenshot of the first screen;
* `report.pdf`: the report printed to PDF (A4, from the report's own `@page` rule);
* a layout probe: a copy of the report with a script that measures the summary element (`#summary`) and
  the page width, read back through `--dump-dom` (the report itself holds no script).

Checks, printed as JSON: the summary element and its heading start within the first screen (900 px); the
page is no wider than the window (wide tables scroll or wrap inside the page); the PDF's pages are A4 and
its first page's text holds "epsilon" and the summary heading (text by pypdf or poppler's `pdftotext`, page
size by pypdf or `pdfinfo`; a check whose tool is missing is reported as skipped). Exit status 0 when
every check passed, 1 when one failed, 2 when Chromium is missing or fails.

    python -m bench.report_render_check REPORT.html --out DIR [--chromium PATH]

Not part of CI (it needs a browser); docs/operations.md says when to run it.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dpsynth.tasks.report.summary import SUMMARY_HEADING, SUMMARY_ID

WIDTH, HEIGHT = 1400, 900
A4_POINTS = (595.0, 842.0)  # 210 x 297 mm
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)
PROBE_ID = "render-probe"
PROBE_SCRIPT = f"""
<script>
(function () {{
  var summary = document.getElementById({json.dumps(SUMMARY_ID)});
  var heading = summary ? summary.querySelector("h2") : null;
  function box(element) {{
    if (!element) return null;
    var r = element.getBoundingClientRect();
    return {{top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, left: r.left, right: r.right}};
  }}
  var out = document.createElement("pre");
  out.id = {json.dumps(PROBE_ID)};
  out.textContent = JSON.stringify({{
    viewport: [window.innerWidth, window.innerHeight],
    page_width: document.documentElement.scrollWidth,
    summary: box(summary),
    summary_heading: box(heading),
    summary_heading_text: heading ? heading.textContent : null,
    first_heading_after_title: (document.querySelector("h2") || {{}}).textContent || null
  }});
  document.body.appendChild(out);
}})();
</script>
"""


def find_chromium(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


def run_chromium(chromium: str, profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def probe_layout(chromium: str, profile: Path, report: Path, out: Path) -> dict:
    """The summary's box and the page width at 1400 px, measured in a copy of the report with a probe script."""
    text = report.read_text(encoding="utf-8")
    probe_page = out / "layout_probe.html"
    probe_page.write_text(text.replace("</body>", PROBE_SCRIPT + "</body>", 1), encoding="utf-8")
    done = run_chromium(chromium, profile, "--virtual-time-budget=5000", "--dump-dom", probe_page.resolve().as_uri())
    found = re.search(rf'<pre id="{PROBE_ID}">(.*?)</pre>', done.stdout, re.DOTALL)
    if not found:
        raise RuntimeError(f"the layout probe did not run (chromium exit {done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(html.unescape(found.group(1))))


def pdf_first_page_text(pdf: Path) -> str | None:
    try:
        from pypdf import PdfReader
    except ImportError:
        tool = shutil.which("pdftotext")
        if tool is None:
            return None
        done = subprocess.run([tool, "-f", "1", "-l", "1", str(pdf), "-"], capture_output=True, text=True, check=False)
        return done.stdout if done.returncode == 0 else None
    return str(PdfReader(pdf).pages[0].extract_text())


def pdf_page_sizes(pdf: Path) -> list[tuple[float, float]] | None:
    try:
        from pypdf import PdfReader
    except ImportError:
        tool = shutil.which("pdfinfo")
        if tool is None:
            return None
        done = subprocess.run([tool, "-l", "1000", str(pdf)], capture_output=True, text=True, check=False)
        sizes = re.findall(r"Page\s+\d+ size:\s+([\d.]+) x ([\d.]+) pts", done.stdout)
        return [(float(w), float(h)) for w, h in sizes] or None
    return [(float(page.mediabox.width), float(page.mediabox.height)) for page in PdfReader(pdf).pages]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def check(report: Path, out: Path, chromium: str) -> dict:
    """Render, print and probe `report` into `out`; {"checks": {name: passed, or None when skipped}, ...}."""
    out.mkdir(parents=True, exist_ok=True)
    screenshot, pdf = out / "first_screen.png", out / "report.pdf"
    with tempfile.TemporaryDirectory(prefix="dpsynth-chromium-") as profile_dir:
        profile = Path(profile_dir)
        url = report.resolve().as_uri()
        shot = run_chromium(chromium, profile, f"--screenshot={screenshot}", url)
        printed = run_chromium(chromium, profile, f"--print-to-pdf={pdf}", "--no-pdf-header-footer", url)
        if not screenshot.exists() or not pdf.exists():
            raise RuntimeError(f"chromium wrote no screenshot or PDF: {shot.stderr[-1000:]} {printed.stderr[-1000:]}")
        layout = probe_layout(chromium, profile, report, out)
    summary, heading = layout.get("summary"), layout.get("summary_heading")
    first_page = pdf_first_page_text(pdf)
    sizes = pdf_page_sizes(pdf)
    checks: dict[str, bool | None] = {
        "summary_in_first_screen": bool(summary) and summary["top"] < HEIGHT,
        "summary_heading_in_first_screen": bool(heading) and heading["bottom"] <= HEIGHT,
        "summary_is_first_section": layout.get("first_heading_after_title") == SUMMARY_HEADING,
        "page_no_wider_than_window": layout["page_width"] <= WIDTH,
        "pdf_first_page_has_epsilon": None if first_page is None else "epsilon" in _flat(first_page),
        "pdf_first_page_has_summary_heading": None
        if first_page is None
        else _flat(SUMMARY_HEADING) in _flat(first_page),
        "pdf_pages_are_a4": None
        if sizes is None
        else all(abs(w - A4_POINTS[0]) < 3 and abs(h - A4_POINTS[1]) < 3 for w, h in sizes),
    }
    return {
        "report": str(report),
        "screenshot": str(screenshot),
        "pdf": str(pdf),
        "pdf_pages": len(sizes) if sizes else None,
        "layout": layout,
        "summary_fits_first_screen": bool(summary) and summary["bottom"] <= HEIGHT,
        "checks": checks,
        "passed": all(v is not False for v in checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("report", type=Path, help="an internal report (report.html)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the screenshot, the PDF and the probe")
    parser.add_argument("--chromium", help="the browser (default: chromium on PATH, or $CHROMIUM)")
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("no Chromium found: apt-get install chromium (or pass --chromium)", file=sys.stderr)
        return 2
    try:
        result = check(args.report, args.out, chromium)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"rendering failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
