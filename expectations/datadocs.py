"""Data Docs that work offline: GX's page templates load jQuery, Bootstrap, bootstrap-table,
Font Awesome and Vega from CDNs. Without them (an air-gapped Airflow, this machine) the pages
render unstyled and the index's validation list stays empty (bootstrap-table draws it).

`make_self_contained(site)` copies the vendored files (`datadocs_vendor/`, see its README) into
`<site>/static/vendor/` and rewrites every page's CDN references to relative paths, so the
site works from any web server or straight from disk. Running it again changes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

VENDOR = Path(__file__).resolve().with_name("datadocs_vendor")
SITE_VENDOR = "static/vendor"

# every CDN address the GX 1.24 templates use -> the vendored file
CDN = {
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        "bootstrap-table-filter-control.min.js",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        "bootstrap-table-filter-control.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        "bootstrap-table-filter-control.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "fontawesome/css/all.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        "bootstrap-datepicker.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        "bootstrap-datepicker.min.js",
    "https://cdn.jsdelivr.net/npm/vega@5": "vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed.min.js",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        "bootstrap-prefers-dark.css",
}
_REMOTE = re.compile(r"""(?:src|href)=["'](https?://[^"']+)["']""")
# the header logo comes from GX's web-assets bucket, tagged with this project's data context id
_LOGO = re.compile(r"""src=["']https://great-expectations-web-assets\.[^"']*/logo-long\.png[^"']*["']""")


def _copy_vendor(site: Path) -> None:
    dest = site / SITE_VENDOR
    for src in VENDOR.rglob("*"):
        if src.is_file() and src.name != "README.md":
            out = dest / src.relative_to(VENDOR)
            if not out.exists() or out.stat().st_size != src.stat().st_size:
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)


def localize(html: str, to_site_root: str) -> str:
    """`html` with every known CDN reference pointed at the site's vendored copy."""
    for url, local in CDN.items():
        html = html.replace(f'"{url}"', f'"{to_site_root}{SITE_VENDOR}/{local}"')
    return _LOGO.sub(f'src="{to_site_root}static/images/logo-long.png"', html)


def remote_references(html: str) -> list[str]:
    """Scripts, stylesheets and images a page still loads from elsewhere (links to docs sites
    are <a href>, not resources, and are not counted)."""
    return [u for u in _REMOTE.findall(html) if u in CDN or re.search(r"\.(js|css|png|svg|gif)(\?|$)", u)]


def make_self_contained(site: Path) -> int:
    """Vendor the assets into `site` and rewrite its pages; the number of pages rewritten."""
    site = Path(site)
    if not site.is_dir():
        return 0
    _copy_vendor(site)
    changed = 0
    for page in site.rglob("*.html"):
        rel = os.path.relpath(site, page.parent)
        to_root = "" if rel == "." else rel + "/"
        text = page.read_text(encoding="utf-8")
        new = localize(text, to_root)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += 1
    return changed
