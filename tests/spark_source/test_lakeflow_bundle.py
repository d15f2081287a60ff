"""The bundle's Lakeflow pipeline example: it loads into Databricks' pipeline model for every
target, and its notebook reads the configuration the pipeline gives it."""

from __future__ import annotations

import re

import pytest
import yaml
from databricks.bundles.pipelines import Pipeline

from tests.unit.test_bundle import RESOURCES, ROOT, TARGETS, _substitute, _variables

pytestmark = pytest.mark.spark_source

RESOURCE = RESOURCES / "sfcdc_lakeflow.pipeline.yml"
NOTEBOOK = ROOT / "notebooks" / "lakeflow_salesforce.py"


@pytest.mark.parametrize("target", TARGETS)
def test_the_pipeline_loads_into_the_databricks_model(target: str) -> None:
    spec = yaml.safe_load(RESOURCE.read_text())["resources"]["pipelines"]["sfcdc_lakeflow"]
    pipeline = Pipeline.from_dict(_substitute(spec, _variables(target)))  # type: ignore[arg-type]
    assert pipeline.catalog and pipeline.schema
    paths = [lib.notebook.path for lib in pipeline.libraries if lib.notebook is not None]
    assert [(RESOURCES / p).resolve() for p in paths] == [NOTEBOOK.resolve()]
    assert pipeline.environment is not None
    assert pipeline.environment.dependencies == ["../dist/*.whl"]


def test_the_notebook_reads_every_setting_the_pipeline_configures() -> None:
    spec = yaml.safe_load(RESOURCE.read_text())["resources"]["pipelines"]["sfcdc_lakeflow"]
    read = set(re.findall(r'spark\.conf\.get\("([\w.]+)"\)', NOTEBOOK.read_text()))
    assert read == set(spec["configuration"])
