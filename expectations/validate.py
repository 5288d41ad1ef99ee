"""Run the suites on one run date's reconciled tables and build the Data Docs.

The GX project is file-backed and lives in the repo (`expectations/gx/`): a Spark data source
with one dataframe asset per table, a suite per table (defined in suites.py), a validation
definition per table and a checkpoint per table (`tidelog_<table>`) that updates the Data
Docs. A checkpoint's batch parameters go to every validation definition it holds, and each
table is its own DataFrame, hence one checkpoint per table; `validate()` runs all three and
fails when any expectation fails. Results and Data Docs go to `expectations/gx/uncommitted/`
(not versioned). What the project holds is only ever (re)written when it differs from
suites.py, so a run leaves the repo clean.
"""

from __future__ import annotations

import os
from pathlib import Path

from expectations.datadocs import make_self_contained
from expectations.suites import LAG_PARAMETER, SUITES

PROJECT_ROOT = Path(os.environ.get("TIDELOG_GX_ROOT", Path(__file__).resolve().parent))
DATASOURCE = "tidelog_spark"
DOCS_SITE = Path("gx") / "uncommitted" / "data_docs" / "local_site"   # great_expectations.yml's local_site
LAG_ENTRIES_MAX = 1000


class ValidationError(RuntimeError):
    pass


def docs_site(root: Path = PROJECT_ROOT) -> Path:
    """Where the Data Docs site is written (served by the Airflow plugin under /tidelog/data-docs/)."""
    return Path(root) / DOCS_SITE


def docs_pages_of(run_date: str, clusters: set[str] | None = None, root: Path = PROJECT_ROOT) -> list[tuple[str, str]]:
    """(name, path relative to the site) of every validation page of `run_date`'s runs (of
    those `clusters` only, when given)."""
    site = docs_site(root)
    out = []
    for p in sorted((site / "validations").glob(f"*/{run_date}_*/*/*.html")):
        suite, run_name, run_time = p.parts[-4], p.parts[-3], p.parts[-2]
        names = run_name.split("_", 1)[1]
        if clusters is None or clusters & set(names.split("+")):
            out.append((f"{suite} · {names} · {run_time}", str(p.relative_to(site))))
    return out


def context(root: Path = PROJECT_ROOT):
    import great_expectations as gx

    return gx.get_context(mode="file", project_root_dir=str(root))


def _same(stored, wanted) -> bool:
    strip = lambda s: sorted(repr(sorted((k, v) for k, v in e.configuration.to_json_dict().items()  # noqa: E731
                                         if k not in ("id", "notes", "meta", "rendered_content")))
                             for e in s.expectations)
    return strip(stored) == strip(wanted)


def ensure(ctx) -> dict:
    """The project's data source, assets, suites, validation definitions and checkpoints; each
    created (or updated) only when missing or different. {table: checkpoint}."""
    import great_expectations as gx
    from great_expectations.exceptions import DataContextError

    try:
        ds = ctx.data_sources.get(DATASOURCE)
    except (KeyError, ValueError, DataContextError):
        ds = ctx.data_sources.add_spark(name=DATASOURCE)
    out = {}
    for table, build in SUITES.items():
        try:
            asset = ds.get_asset(table)
        except LookupError:
            asset = ds.add_dataframe_asset(name=table)
        try:
            bd = asset.get_batch_definition("whole")
        except (KeyError, ValueError, LookupError):
            bd = asset.add_batch_definition_whole_dataframe("whole")
        wanted = gx.ExpectationSuite(name=table, expectations=build())
        try:
            suite = ctx.suites.get(table)
            if not _same(suite, wanted):
                ctx.suites.delete(table)
                suite = ctx.suites.add(wanted)
        except DataContextError:
            suite = ctx.suites.add(wanted)
        name = f"tidelog_{table}"
        try:
            vd = ctx.validation_definitions.get(name)
            if vd.suite.name != table or vd.suite.id != suite.id:
                raise DataContextError("stale")
        except DataContextError:
            try:
                ctx.validation_definitions.delete(name)
            except DataContextError:
                pass
            vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=name, data=bd, suite=suite))
        try:
            cp = ctx.checkpoints.get(name)
            if [v.name for v in cp.validation_definitions] != [name]:
                raise DataContextError("stale")
        except DataContextError:
            try:
                ctx.checkpoints.delete(name)
            except DataContextError:
                pass
            cp = ctx.checkpoints.add(gx.Checkpoint(
                name=name, validation_definitions=[vd],
                actions=[gx.checkpoint.UpdateDataDocsAction(name="update_data_docs")],
                result_format={"result_format": "SUMMARY"}))
        out[table] = cp
    return out


def _failures(result) -> list[dict]:
    out = []
    for vr in result.run_results.values():
        for r in vr.results:
            if not r.success:
                cfg = r.expectation_config
                res = r.result or {}
                out.append({"suite": vr.suite_name, "expectation": cfg.type,
                            "description": cfg.description or cfg.type,
                            "unexpected_count": res.get("unexpected_count", res.get("observed_value")),
                            "sample": (res.get("details") or {}).get("unexpected_rows",
                                                                       res.get("partial_unexpected_list"))})
    return out


def validate(run_date: str, warehouse: Path, spark=None, lag_entries_max: int = LAG_ENTRIES_MAX,
             root: Path = PROJECT_ROOT) -> dict:
    """Run every table's checkpoint on `run_date`'s rows; {"success", "failures", "data_docs"}."""
    from great_expectations.core.run_identifier import RunIdentifier
    from pyspark.sql import functions as F

    from spark_jobs import warehouse as wh

    spark = spark or wh.session(app="tidelog-validate")
    ctx = context(root)
    checkpoints = ensure(ctx)
    results, failures, clusters = {}, [], set()
    for table, cp in checkpoints.items():
        try:
            df = wh.read_table(spark, warehouse, table)
        except FileNotFoundError as e:
            raise ValidationError(str(e)) from None
        df = df.filter(F.col("run_date") == F.lit(run_date).cast("date"))
        if df.isEmpty():
            raise ValidationError(f"{table} has no rows for run date {run_date} in {warehouse}")
        names = sorted(r.cluster for r in df.select("cluster").distinct().collect())
        clusters.update(names)
        r = cp.run(batch_parameters={"dataframe": df}, expectation_parameters={LAG_PARAMETER: lag_entries_max},
                   run_id=RunIdentifier(run_name=f"{run_date}_{'+'.join(names)}"))
        _name_the_data(ctx, r, f"{table} · {run_date} · {', '.join(names)}")
        results[table] = bool(r.success)
        failures += _failures(r)
    return {"run_date": run_date, "warehouse": str(warehouse), "success": all(results.values()),
            "tables": results, "failures": failures, "clusters": sorted(clusters),
            "data_docs": _publish_docs(ctx, root)}


def _name_the_data(ctx, result, name: str) -> None:
    """GX 1.x leaves the page's "Data asset" empty (its renderer still reads the 0.x batch_kwargs):
    record which table, run date and cluster each stored result is about."""
    for key, vr in result.run_results.items():
        vr.meta["batch_kwargs"] = {"data_asset_name": name}
        ctx.validation_results_store.set(key, vr)


def _publish_docs(ctx, root: Path) -> str | None:
    """Rebuild the Data Docs from the stored results and make them work offline; the index URL."""
    ctx.build_data_docs()
    make_self_contained(docs_site(root))
    docs = ctx.get_docs_sites_urls()
    return docs[0]["site_url"] if docs else None
