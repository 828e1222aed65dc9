"""The dashboard's static files ship inside the package and reference each other."""

from __future__ import annotations

from gateway.admin.dashboard import STATIC_FILES, static_file


def test_every_static_file_is_package_data_and_the_page_loads_the_others() -> None:
    page = static_file("index.html").decode()
    for name in STATIC_FILES:
        assert static_file(name), name
        if name != "index.html":
            assert f'"{name}"' in page, name


def test_the_script_inserts_api_values_as_text_only() -> None:
    script = static_file("dashboard.js").decode()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
