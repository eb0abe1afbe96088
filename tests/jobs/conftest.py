"""The jobs' tests share the connector's local SparkSession (one per run)."""

from tests.connector.conftest import spark  # noqa: F401
