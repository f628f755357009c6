"""Headless Chromium for the web map: the launch the browser tests use, and a screenshot of a
publish root's page (docs/setup.md's docs/webmap-demo.png and docs/webmap-demo-phone.png).

    python -m dpatlas.publication.webmap.screenshot demo/releases docs/webmap-demo.png --click --palette
    python -m dpatlas.publication.webmap.screenshot demo/releases docs/webmap-demo-phone.png --phone --click --palette

Uses Debian's ``chromium`` through Playwright's ``executable_path``: Playwright never
downloads a browser here. WebGL runs on SwiftShader (software), as there is no GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox (root in a container); no network of the browser's own; WebGL via SwiftShader.
CHROMIUM_FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--use-gl=angle", "--use-angle=swiftshader",
                  "--enable-unsafe-swiftshader")
VIEWPORT = {"width": 1280, "height": 800}        # a desktop
PHONE_VIEWPORT = {"width": 390, "height": 844}   # a phone held upright (the panel starts folded)


class BrowserMissing(RuntimeError):
    """Chromium or Playwright is not installed; the message says how to install it."""


def launch_chromium(playwright):
    """Headless Chromium from the system (a fresh profile per launch)."""
    if not CHROMIUM.is_file():
        raise BrowserMissing(f"Chromium is not installed at {CHROMIUM}: run `apt-get install "
                             "-y chromium` (make browser does it)")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=list(CHROMIUM_FLAGS))


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        raise BrowserMissing("the playwright package is not installed (it is in the test "
                             "extra): run `.venv/bin/pip install -r requirements.lock`") from None
    return start()


def screenshot_root(root: Path, out: Path, *, click_centre: bool = False,
                    palette: bool = False, phone: bool = False) -> Path:
    """Serve ``root``, open its page on the latest release, wait until the map is drawn and
    save a screenshot to ``out`` (at :data:`PHONE_VIEWPORT` if ``phone``, else
    :data:`VIEWPORT`; with the popup of the unit at the map's centre open if ``click_centre``;
    reduced to 256 colours if ``palette``, a third of the size, for committing)."""
    from dpatlas.publication.serve import serve_in_thread

    server, base = serve_in_thread(root)
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                page = browser.new_page(viewport=PHONE_VIEWPORT if phone else VIEWPORT,
                                        device_scale_factor=1)
                page.goto(base)
                page.wait_for_function("window.dpatlas && window.dpatlas.loaded",
                                       timeout=60_000)
                if click_centre:
                    box = page.locator("#map").bounding_box()
                    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                    page.wait_for_selector(".maplibregl-popup-content", timeout=10_000)
                    # Let the map pan the popup into view before the shot.
                    page.evaluate("""() => new Promise(resolve => {
                        const map = window.dpatlas.map; map.once('idle', resolve);
                        map.triggerRepaint(); })""")
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    if palette:
        from PIL import Image

        with Image.open(out) as image:
            # Fast octree keeps the few flat legend colours exact (median cut, the default,
            # shifted some class colours visibly).
            image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
                out, optimize=True)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot a publish root's web map.")
    parser.add_argument("root", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--click", action="store_true", help="open the centre tract's popup")
    parser.add_argument("--palette", action="store_true", help="save with 256 colours")
    parser.add_argument("--phone", action="store_true",
                        help=f"a phone's screen ({PHONE_VIEWPORT['width']}x"
                             f"{PHONE_VIEWPORT['height']}) instead of a desktop's")
    args = parser.parse_args(argv)
    try:
        print(screenshot_root(args.root, args.out, click_centre=args.click,
                              palette=args.palette, phone=args.phone))
    except BrowserMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
