"""``report.html`` opened in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromedriver (no browser or driver downloaded). A screenshot is taken, every figure must
have loaded (``naturalWidth > 0``), the tables must be there and the console must hold no error.

Without Chromium the test is skipped with the reason, except where ``NNUNET_DRO_REQUIRE_BROWSER=1``
(set by ``.ci/run``, which installs the browser): there a missing browser fails, so CI cannot pass
without having opened the page.
"""
from __future__ import annotations

import os
import shutil

import pytest
from test_eval_gallery import make_dataset

from nnunet_dro.evaluation import evaluate

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REQUIRED = os.environ.get("NNUNET_DRO_REQUIRE_BROWSER") == "1"
#: Offline and quiet: no sign-in, updates, field trials or background fetches that could reach the network.
ARGUMENTS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--window-size=1400,1000")


def _driver(chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER, required: bool = REQUIRED):
    missing = [path for path in (chromium, chromedriver) if not os.access(path, os.X_OK)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the Python package selenium (pip install -e '.[test]')")
    if missing:
        reason = (f"no browser to open report.html: {', '.join(missing)} missing "
                  "(apt-get install -y chromium chromium-driver)")
        if required:
            pytest.fail(reason + "; NNUNET_DRO_REQUIRE_BROWSER=1 says this run must have one")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ARGUMENTS:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver path given: Selenium Manager never looks for (or downloads) a driver of its own
    return webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)


def _broken_images(driver) -> list[str]:
    images = driver.execute_script("return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth]);")
    return [alt for alt, complete, width in images if not complete or width == 0]


def _console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    labels, pred = make_dataset(root, n_cases=4)
    shutil.copytree(pred, root / "pred_b")
    out = root / "out"
    evaluate(str(labels), {"A": str(pred), "B": str(root / "pred_b")}, str(out), groups=str(root / "groups.tsv"),
             group_by=["age"], num_processes=1, progress=False, gallery=2, n_bootstrap=20)
    return out / "report.html"


def test_report_html_in_headless_chromium(report_page, tmp_path):
    driver = _driver()
    try:
        driver.get(report_page.as_uri())
        screenshot = tmp_path / "report.png"
        assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 1000
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth]);")
        # box plots, disparity figure, gallery (one metric)
        assert len(images) == 3
        broken = _broken_images(driver)
        assert not broken, f"figures that did not load: {broken}"
        tables = driver.execute_script("return document.querySelectorAll('table').length;")
        assert tables == report_page.with_name("table.md").read_text().count("\n|---")
        cells = driver.execute_script("return document.querySelectorAll('td').length;")
        assert cells > 20
        sections = driver.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id);")
        assert sections == ["summary", "tables", "figures", "settings"]
        errors = _console_errors(driver)
        assert not errors, errors
    finally:
        driver.quit()


def test_the_checks_see_a_broken_figure_and_a_console_error(tmp_path):
    import base64
    import io

    import matplotlib.image
    import numpy as np

    png = io.BytesIO()
    matplotlib.image.imsave(png, np.zeros((4, 4)), format="png")
    fine = base64.b64encode(png.getvalue()).decode("ascii")
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><img alt="cut" src="data:image/png;base64,iVBORw0KGgo=">'
                    f'<img alt="fine" src="data:image/png;base64,{fine}">'
                    '<script>console.error("planted")</script></body></html>', encoding="utf-8")
    driver = _driver()
    try:
        driver.get(page.as_uri())
        assert _broken_images(driver) == ["cut"]
        assert any("planted" in entry["message"] for entry in _console_errors(driver))
    finally:
        driver.quit()


def test_a_missing_browser_fails_where_ci_requires_one_and_skips_elsewhere(tmp_path):
    absent = str(tmp_path / "chromium")
    with pytest.raises(pytest.fail.Exception, match="NNUNET_DRO_REQUIRE_BROWSER=1"):
        _driver(chromium=absent, required=True)
    with pytest.raises(pytest.skip.Exception, match=f"{absent}.* missing"):
        _driver(chromium=absent, required=False)
