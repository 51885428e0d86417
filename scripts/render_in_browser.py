#!/usr/bin/env python3
"""Render PR comments the way GitHub does and measure them in a real browser.

cmark-gfm (GFM extensions table, strikethrough, autolink, tagfilter) turns the comment into HTML,
github-markdown-css styles it in a COLUMN_PX wide comment column, Mermaid 11 draws the charts, and
Debian's headless Chromium lays the page out. A script in the page writes its measurements into
the DOM, which ``chromium --dump-dom`` returns: the verdict's and the first fix's position with the
comment as posted (details closed), then, with every ``<details>`` open, each table's and chart's
width and every Mermaid error. Nothing is downloaded by a package: the tools come from Debian
(apt-get install chromium cmark-gfm) and the npm registry (npm install mermaid github-markdown-css
into BROWSER_DIR, default $GATE_CACHE_DIR/browser; .ci/run does both).

    python scripts/render_in_browser.py [COMMENT.md ...]        # measurements as JSON
    python scripts/render_in_browser.py --screenshots            # docs/comment-{pass,fail}.png
    python scripts/render_in_browser.py --install                # npm install the page's packages

tests/browser/test_comment_in_browser.py asserts on the measurements of docs/examples/*.md.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
COLUMN_PX = 780  # the comment body's width on a pull request's conversation page
FIRST_SCREEN_PX = 800  # what a reader sees of the comment without scrolling
EXTENSIONS = ("table", "strikethrough", "autolink", "tagfilter")
NPM_PACKAGES = ("mermaid@11.17.2", "github-markdown-css@5.9.0")
SCREENSHOTS = {  # the real model's comments: real BPE pieces in the worst tokens and greedy answers
    "smollm2-fail": REPO / "docs" / "comment-fail.png",
    "smollm2-pass": REPO / "docs" / "comment-pass.png",
}
TIMEOUT_S = 60


def browser_dir() -> Path:
    env = os.environ.get("GATE_BROWSER_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("GATE_CACHE_DIR") or str(Path.home() / ".cache" / "gate")
    return Path(cache) / "browser"


@dataclass(frozen=True)
class Tools:
    cmark: str
    chromium: str
    mermaid_js: Path
    css: Path


def find_tools() -> tuple[Tools | None, list[str]]:
    """The tools, or None and what is missing (each with how to get it)."""
    base = browser_dir() / "node_modules"
    found = {
        "cmark-gfm": shutil.which("cmark-gfm"),
        "chromium": shutil.which("chromium") or shutil.which("chromium-browser"),
        "mermaid": base / "mermaid" / "dist" / "mermaid.min.js",
        "github-markdown-css": base / "github-markdown-css" / "github-markdown-light.css",
    }
    missing = [
        f"{name} (apt-get install {name})" if name in ("cmark-gfm", "chromium") else
        f"{name} (npm install --prefix {browser_dir()} {' '.join(NPM_PACKAGES)})"
        for name, v in found.items()
        if v is None or (isinstance(v, Path) and not v.is_file())
    ]  # fmt: skip
    if missing:
        return None, missing
    return Tools(str(found["cmark-gfm"]), str(found["chromium"]), Path(str(found["mermaid"])),
                 Path(str(found["github-markdown-css"]))), []  # fmt: skip


def to_html(markdown: str, tools: Tools) -> str:
    """GitHub's Markdown: cmark-gfm with its extensions; raw HTML kept (tagfilter drops the unsafe tags)."""
    args = [tools.cmark, "--unsafe", "--github-pre-lang"]
    for ext in EXTENSIONS:
        args += ["-e", ext]
    return subprocess.run(args, input=markdown, capture_output=True, text=True, check=True).stdout


# Runs in the page: measures, renders the charts, measures again, writes JSON into #gate-result.
PAGE_SCRIPT = r"""
(async () => {
  const col = document.querySelector('.markdown-body');
  const top = col.getBoundingClientRect().top;
  const out = {verdict_bottom: null, fix_bottom: null, charts: 0, mermaid_errors: [], overflow: []};
  const heading = col.querySelector('h2, h3');
  if (heading) out.verdict_bottom = heading.getBoundingClientRect().bottom - top;
  for (const s of col.querySelectorAll('strong')) {
    if (s.textContent.trim() === 'Fix:') {
      out.fix_bottom = s.closest('p, li, td').getBoundingClientRect().bottom - top; break;
    }
  }
  out.height_as_posted = col.getBoundingClientRect().height;
  if (SHOT) { document.body.dataset.done = '1'; return; }
  col.querySelectorAll('details').forEach(d => { d.open = true; });
  mermaid.initialize({startOnLoad: false});
  const blocks = [...col.querySelectorAll('pre[lang="mermaid"]')];
  for (const [i, pre] of blocks.entries()) {
    const source = pre.textContent;
    try {
      const {svg} = await mermaid.render('gate-chart-' + i, source);
      const div = document.createElement('div');
      div.innerHTML = svg;
      pre.replaceWith(div);
      if (/Syntax error in text|aria-roledescription="error"/.test(svg)) out.mermaid_errors.push(i + ': error drawn');
      else out.charts += 1;
    } catch (e) {
      out.mermaid_errors.push(i + ': ' + String(e && e.message || e).slice(0, 200));
    }
  }
  const right = col.getBoundingClientRect().left + col.clientWidth;
  const label = el => (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 80);
  out.tables = [...col.querySelectorAll('table')].map(t => ({
    width: Math.ceil(t.scrollWidth), visible: Math.ceil(t.clientWidth), text: label(t)}));
  for (const el of col.querySelectorAll('table, pre, svg, p, li, summary, h2, h3, div')) {
    const r = el.getBoundingClientRect();
    const scrolls = (el.tagName === 'TABLE' || el.tagName === 'PRE') && el.scrollWidth > el.clientWidth + 1;
    if (r.right > right + 1 || scrolls)
      out.overflow.push({tag: el.tagName.toLowerCase(), width: Math.ceil(Math.max(r.width, el.scrollWidth)), text: label(el)});
  }
  out.palette_found = blocks.length === 0 || document.body.innerHTML.includes('#d62728');
  out.height_expanded = col.getBoundingClientRect().height;
  document.getElementById('gate-result').textContent = JSON.stringify(out);
})().catch(e => { document.getElementById('gate-result').textContent = JSON.stringify({page_error: String(e)}); });
"""


def page(body: str, tools: Tools, shot: bool) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<link rel="stylesheet" href="{tools.css.resolve().as_uri()}">
<style>body {{ margin: 0; padding: 16px; background: #fff; }}
.markdown-body {{ box-sizing: border-box; width: {COLUMN_PX}px; }}
#gate-result {{ display: none; }}</style>
<script src="{tools.mermaid_js.resolve().as_uri()}"></script>
</head><body><article class="markdown-body">{body}</article><pre id="gate-result"></pre>
<script>const SHOT = {"true" if shot else "false"};{PAGE_SCRIPT}</script></body></html>
"""


def _chromium(tools: Tools, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [tools.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--allow-file-access-from-files", "--virtual-time-budget=20000", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


_RESULT = re.compile(r'<pre id="gate-result">(.*?)</pre>', re.S)


def measure(markdown: str, tools: Tools, workdir: Path) -> dict[str, Any]:
    """Render ``markdown`` as a posted comment and return the page's measurements."""
    path = workdir / "comment.html"
    path.write_text(page(to_html(markdown, tools), tools, shot=False), encoding="utf-8")
    proc = _chromium(tools, "--window-size=900,2000", "--dump-dom", path.as_uri())
    found = _RESULT.search(proc.stdout)
    if not found or not found.group(1).strip():
        raise RuntimeError(
            f"chromium wrote no measurements (rc {proc.returncode}): {proc.stderr[-2000:]}"
        )
    return json.loads(html.unescape(found.group(1)))


def screenshot(markdown: str, tools: Tools, out: Path, workdir: Path, height: int = 900) -> None:
    """A PNG of the comment's first ``height`` pixels as posted (details closed)."""
    path = workdir / f"{out.stem}.html"
    path.write_text(page(to_html(markdown, tools), tools, shot=True), encoding="utf-8")
    proc = _chromium(
        tools, f"--window-size={COLUMN_PX + 32},{height}", f"--screenshot={out}", path.as_uri()
    )
    if not out.is_file():
        raise RuntimeError(
            f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
        )


def install() -> int:
    """The page's npm packages, pinned, into browser_dir() (nothing else is fetched)."""
    _, missing = find_tools()
    if not any(m.startswith(("mermaid", "github-markdown-css")) for m in missing):
        return 0
    browser_dir().mkdir(parents=True, exist_ok=True)
    cmd = [
        "npm",
        "install",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(browser_dir()),
        *NPM_PACKAGES,
    ]
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("comments", nargs="*", type=Path)
    parser.add_argument("--screenshots", action="store_true", help="write " + ", ".join(
        str(p.relative_to(REPO)) for p in SCREENSHOTS.values()))  # fmt: skip
    parser.add_argument("--install", action="store_true",
                        help=f"npm install {' '.join(NPM_PACKAGES)} into {browser_dir()} unless there")  # fmt: skip
    args = parser.parse_args(argv)
    if args.install:
        return install()
    tools, missing = find_tools()
    if tools is None:
        print("missing: " + "; ".join(missing), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.screenshots:
            for name, out in SCREENSHOTS.items():
                text = (REPO / "docs" / "examples" / f"{name}.md").read_text(encoding="utf-8")
                screenshot(
                    text, tools, out, Path(tmp), height=900 if name.endswith("fail") else 250
                )
                print(f"wrote {out.relative_to(REPO)}", file=sys.stderr)
            return 0
        paths = args.comments or sorted((REPO / "docs" / "examples").glob("*.md"))
        result = {p.name: measure(p.read_text(encoding="utf-8"), tools, Path(tmp)) for p in paths}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
