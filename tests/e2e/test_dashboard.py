"""The web dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

A gateway runs the demo's two services on the local platform (replicas started from
``python -m gateway.tools.demo``) with an admin token; the browser sends the token as every
client of the admin API must.  The page loads, lists the services with their routes, shows
no traffic, then shows the load once ``sluice load`` starts and a decision with its reasons.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_local_demo import service
from tests.support.processes import ROOT, Gateway
from tests.support.procs import pids_with_marker, wait_until

CHROMIUM = "/usr/bin/chromium"
TOKEN = "dashboard-test-token-0123456789abcdef"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} not installed (apt-get install chromium)"
)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Gateway]:
    marker = uuid.uuid4().hex
    config = {
        "platform": "local",
        "admin": {"host": "127.0.0.1", "port": 0, "token": TOKEN},
        "budget": {"cpu": 2},
        "services": {
            "api": service("/api", marker, {"target": 4, "min_replicas": 1, "max_replicas": 2}),
            "reports": service(
                "/reports", marker, {"target": 2, "min_replicas": 0, "max_replicas": 2, "weight": 2}
            ),
        },
    }
    gw = Gateway(config, tmp_path / "demo.yaml")
    try:
        yield gw
    finally:
        gw.stop()
        assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)


def test_the_page_follows_the_admin_token_rules(demo: Gateway) -> None:
    with httpx.Client(base_url=demo.admin_url, timeout=10) as admin:
        for path in ("/", "/dashboard.js", "/dashboard.css", "/api/overview"):
            assert admin.get(path).status_code == 401, path
        page = admin.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert '<script src="dashboard.js">' in page.text


def test_the_dashboard_shows_services_load_and_a_decisions_reasons(
    demo: Gateway, tmp_path: Path
) -> None:
    with sync_api.sync_playwright() as p:
        # Playwright gives the browser a new empty profile directory of its own.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            context = browser.new_context(
                viewport={"width": 1440, "height": 1000},
                extra_http_headers={"Authorization": f"Bearer {TOKEN}"},
            )
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(demo.admin_url + "/")

            # The demo's services, with their routes and floors / fair shares.
            page.wait_for_selector('#services tr[data-service="api"]', timeout=30_000)
            page.wait_for_selector('#services tr[data-service="reports"]', timeout=30_000)
            api_row = page.locator('#services tr[data-service="api"]')
            assert "/api*" in api_row.inner_text()
            assert "/reports*" in page.locator('#services tr[data-service="reports"]').inner_text()
            assert page.locator("#status").get_attribute("data-state") == "live"
            shares = page.locator('#shares tr[data-service="reports"]').inner_text()
            assert "1.33" in shares  # reports' fair share: weight 2 of 3 (budget 2 cores)
            # reports starts at zero replicas: no load yet.
            reports = page.locator('#services tr[data-service="reports"] td.replicas')
            assert reports.inner_text().startswith("0 /")

            load = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "load",
                    "--config",
                    str(demo.config_path),
                    "--target",
                    f"{demo.host}:{demo.port}",
                    "--duration",
                    "20",
                    "--rps",
                    "10",
                    "--burst-rps",
                    "10",
                    "--burst-s",
                    "15",
                    "--period-s",
                    "30",
                    "--first-burst-s",
                    "0",
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                # The page updates by itself: reports scales from zero, the rates rise.
                page.wait_for_function(
                    """() => {
                        const cell = document.querySelector(
                            '#services tr[data-service="reports"] td.replicas');
                        return cell && parseInt(cell.textContent) >= 1;
                    }""",
                    timeout=60_000,
                )
                page.wait_for_function(
                    """() => {
                        const cell = document.querySelector(
                            '#services tr[data-service="api"] td.rps');
                        return cell && parseFloat(cell.textContent) > 0;
                    }""",
                    timeout=60_000,
                )
                # A decision with its reasons (the explanation rendered) and the budget chart.
                card = page.locator('.decision[data-service="reports"]')
                card.locator("ol.reasons li").first.wait_for(timeout=30_000)
                reasons = card.locator("ol.reasons li").all_inner_texts()
                assert reasons and all(r.strip() for r in reasons), reasons
                page.wait_for_selector(
                    '#budget-chart polygon[data-service="reports"]', state="attached"
                )
                page.wait_for_selector("#recent-decisions td", timeout=30_000)
                shot = os.environ.get("SLUICE_DASHBOARD_SCREENSHOT")
                page.screenshot(path=shot or str(tmp_path / "dashboard.png"), full_page=True)
            finally:
                load.terminate()
                load.wait(30)
            assert errors == []
        finally:
            browser.close()
