from pyspark.sql.datasource import CaseInsensitiveDict, DataSource, DataSourceStreamReader

from veil.store import Publication


def published(*bodies: bytes) -> list[Publication]:
    """Publications of these bytes by an anonymous publisher."""
    return [Publication(body) for body in bodies]


def stream_reader(source: type[DataSource], **options: str) -> DataSourceStreamReader:
    """The reader of a Python data source built as Spark builds it: from options whose keys Spark
    lowercases (a reader that copied them into a plain dict would miss every camelCase one)."""
    return source(CaseInsensitiveDict({"store": "sqlite:///nowhere/veil.db", **options})).streamReader(None)
