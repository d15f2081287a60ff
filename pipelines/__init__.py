"""The Spark side of sfcdc: YAML spec, lake engines, bronze/silver/gold jobs and the CLI."""

__all__: list[str] = []
