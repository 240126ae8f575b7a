"""The HTML report in a real headless browser (Chromium's headless shell,
Debian package ``chromium-headless-shell``): the page renders, the answer is
on the first screen and the winner's row is highlighted.  The screenshots
are kept as the tests' artifacts (``$QTUNE_TEST_ARTIFACTS``, else pytest's
temporary folder) for a person to look at.  Skipped where no such browser
is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from qtune.report import load_study, render_html
from qtune.search.result import trials_frame

FIXTURES = Path(__file__).parent / "fixtures"
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
BROWSER = next((b for b in BROWSERS if shutil.which(b)), None)

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed "
                                "(apt-get install chromium-headless-shell)")


def _shot(page: Path, png: Path, width: int, height: int) -> None:
    assert BROWSER is not None
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={png}",
                    f"--window-size={width},{height}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)


def _near(px: tuple[int, ...], rgb: tuple[int, int, int], tol: int = 24) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(px[:3], rgb, strict=True))


@pytest.mark.parametrize(("study", "journal"), [
    ("h200-qwen3-4b", FIXTURES / "h200-run6" / "h200-journal.log"),
    ("h200-engines", FIXTURES / "h200-engines-run11" / "eng.log"),
])
def test_the_answer_is_on_the_first_screen(tmp_path, study, journal):
    # Pillow comes with the engine's stack (vLLM), not with qtune's test extra
    Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")

    artifacts = Path(os.environ.get("QTUNE_TEST_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    st, url = load_study(study, f"journal://{journal}")
    page = tmp_path / f"{study}.html"
    page.write_text(render_html(st, url, trials_frame(st), {}))
    png = artifacts / f"report-{study}.png"
    _shot(page, png, 1280, 800)  # a laptop's first screen
    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 800)
    px = img.load()
    rows_with = {y for y in range(img.height) for x in range(0, img.width, 4)
                 if _near(px[x, y], (0x2c, 0xa0, 0x2c))}
    # the recommendation's green frame is drawn, and within the first screen
    assert rows_with and min(rows_with) < 200
    # the winner's row (highlighted) is on the first screen too
    assert any(_near(px[x, y], (0xdf, 0xf5, 0xdf), 6)
               for y in range(img.height) for x in range(0, img.width, 8))
    # a narrow window: the table scrolls inside its box, the page does not
    # get wider than the window (the plots wrap below each other).  The
    # page has no script; a copy with one reports the page's width.
    _shot(page, artifacts / f"report-{study}-narrow.png", 800, 1200)
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace(
        "</body>", "<script>document.title = 'W' + document.documentElement.scrollWidth"
        " + 'x' + document.documentElement.clientWidth</script></body>"))
    dom = subprocess.run([str(BROWSER), "--headless", "--no-sandbox", "--disable-gpu",
                          "--window-size=800,1200", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    scroll, client = dom.split("<title>W", 1)[1].split("</title>", 1)[0].split("x")
    assert int(scroll) <= int(client), (scroll, client)
