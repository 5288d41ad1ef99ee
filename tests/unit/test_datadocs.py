"""Data Docs work offline: every CDN asset GX's templates load is vendored, and a site's pages
are rewritten to load the copies (idempotently)."""

from __future__ import annotations

import re
from pathlib import Path

import great_expectations

from expectations.datadocs import CDN, SITE_VENDOR, VENDOR, make_self_contained, remote_references

TEMPLATES = Path(great_expectations.__file__).parent / "render" / "view" / "templates"


def test_every_asset_the_gx_templates_load_from_a_cdn_is_vendored():
    used = set()
    for t in TEMPLATES.rglob("*"):
        if t.is_file():
            used |= set(re.findall(r"""(?:src|href)=["'](https?://[^"'{}]+)["']""", t.read_text(errors="replace")))
    assets = {u for u in used if u in CDN or re.search(r"\.(js|css)(\?|$)", u) or "jsdelivr" in u}
    assert assets, "found no CDN reference in GX's templates: has their layout changed?"
    assert assets <= set(CDN), f"GX loads assets we do not vendor: {sorted(assets - set(CDN))}"
    for local in CDN.values():
        assert (VENDOR / local).stat().st_size > 100, local


def page(to_root: str) -> str:
    refs = "\n".join(f'<script src="{u}"></script>' if u.endswith(("js", "@5", "@6")) else
                     f'<link rel="stylesheet" href="{u}">' for u in CDN)
    logo = ('<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png'
            '?d=20261123T1&dataContextId=abc">')
    return f'<html><head>{refs}</head><body>{logo}<a href="https://greatexpectations.io">GX</a></body></html>'


def test_a_site_is_rewritten_to_its_own_copies_once(tmp_path):
    site = tmp_path / "site"
    (site / "validations" / "t" / "run").mkdir(parents=True)
    (site / "index.html").write_text(page(""))
    deep = site / "validations" / "t" / "run" / "v.html"
    deep.write_text(page("../../../"))
    assert remote_references(deep.read_text())
    assert make_self_contained(site) == 2
    assert make_self_contained(site) == 0          # nothing left to change
    for p in (site / "index.html", deep):
        text = p.read_text()
        assert remote_references(text) == [], p
        assert 'href="https://greatexpectations.io"' in text   # ordinary links stay links
    assert f'src="../../../{SITE_VENDOR}/jquery.min.js"' in deep.read_text()
    assert 'src="static/images/logo-long.png"' in (site / "index.html").read_text()
    for local in CDN.values():   # every referenced file resolves inside the site
        assert (site / SITE_VENDOR / local).is_file(), local
    assert (site / SITE_VENDOR / "fontawesome" / "webfonts" / "fa-solid-900.woff2").is_file()


def test_the_plugin_serves_a_page_self_contained_while_gx_rebuilds_the_site(tmp_path):
    """A page read between GX's rebuild (CDN links) and the rewrite, as on an Airflow that shows
    the Data Docs while a validation runs, still loads only local files; a site that was never
    rewritten gets the vendored files from the package."""
    from fastapi import HTTPException

    from ops.airflow_plugin import docs_page

    site = tmp_path / "site"
    (site / "validations" / "t" / "run").mkdir(parents=True)
    (site / "index.html").write_text(page(""))
    (site / "validations" / "t" / "run" / "v.html").write_text(page(""))
    for path, to_root in (("index.html", ""), ("validations/t/run/v.html", "../../../")):
        body = docs_page(site, path).body.decode()
        assert remote_references(body) == [], path
        assert f'src="{to_root}{SITE_VENDOR}/jquery.min.js"' in body, path
        for local in re.findall(r'(?:src|href)="((?:\.\./)*static/vendor/[^"]+)"', body):
            served = docs_page(site, local.replace("../", ""))
            assert Path(served.path).stat().st_size > 100, local
    assert (site / "index.html").read_text() == page("")          # serving changes no file
    for bad in ("../x.html", f"{SITE_VENDOR}/../../../etc/passwd", f"{SITE_VENDOR}/nothing.js"):
        try:
            docs_page(site, bad)
        except HTTPException as e:
            assert e.status_code == 404, bad
        else:
            raise AssertionError(f"served {bad}")
