"""``lakegate_table``: a batch Python data source over one Delta table, read
with delta-rs at its latest version when a query is planned.

Without delta-spark's jars (with them the endpoint serves the Delta tables
themselves: :mod:`bridge.sqlserve.catalog`) the endpoint's catalog tables
(``messages``, ``retained_all``, ``quarantine``, ``retained_versions``; the
view ``retained`` over ``retained_all``) use it, so that every Spark Connect
session (a BI tool without lakegate's code included) reads each query at the
tables' newest version: the planner opens the table once (one snapshot for the whole
query), one partition per data file, each read with pyarrow on a Python
worker; partition values come from the Delta log, not from paths. A table
with deletion vectors is read through delta-rs as one partition.

Options: ``delta_dir`` (the table's directory; not ``path``, which Spark takes for a catalog table's location), ``table`` (its schema:
``messages``, ``retained``, ``quarantine`` or ``retained_versions``),
``version`` (optional: a Delta version, for time travel).

Spark finds them without registration in every session: its static lookup
imports the modules named ``pyspark_*`` on the Python workers' path and
registers their ``DefaultSource``; ``static_sources/`` holds one per source
(``lakegate_table`` by options; ``lakegate_messages``, ``lakegate_retained_all``,
``lakegate_quarantine``, ``lakegate_retained_versions`` fixed, for catalog
tables, whose OPTIONS Spark does not pass on) and
:func:`bridge.spark.session.build_session` puts that directory on the path.
"""

from __future__ import annotations

from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = ["LakegateTable", "NAME"]

NAME = "lakegate_table"


def _schema_ddl(table: str) -> str:
    from schemas.tables import TABLES

    if table == "retained_versions":
        from bridge.tables.views import _VERSIONS_DDL

        return _VERSIONS_DDL
    if table not in TABLES:
        raise ValueError(f"lakegate_table: option table must be one of {', '.join([*TABLES, 'retained_versions'])}, "
                         f"got {table!r}")
    return TABLES[table]


def _local(table_dir: str, path: str) -> str:
    """A data file's local path: the Delta log's relative path is a percent-encoded URI
    reference (a space is %20), joined to the table's directory as the file system spells it."""
    import os

    from bridge.tables.deltars import _local_path

    return _local_path(path) if "://" in path else os.path.join(table_dir, _local_path(path))


class _File(InputPartition):
    def __init__(self, uri: str, partition_values: dict[str, Any]) -> None:
        super().__init__(uri)
        self.uri = uri
        self.partition_values = partition_values


class _Whole(InputPartition):
    """The whole table through delta-rs (deletion vectors), or the versions list."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        from deltalake import DeltaTable

        self.path = options["delta_dir"]
        self.table = options.get("table", "")
        dt = DeltaTable(self.path)
        if options.get("version") not in (None, ""):
            dt.load_as_version(int(options["version"]))
        self.version = dt.version()
        self.parts: list[InputPartition]
        features = set(getattr(dt.protocol(), "reader_features", None) or [])
        if self.table == "retained_versions" or "deletionVectors" in features:
            self.parts = [_Whole(self.version)]
        else:
            import pyarrow as pa

            actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()  # arro3 -> pyarrow
            pcols = list(dt.metadata().partition_columns)
            self.parts = [_File(_local(self.path, a["path"]), {c: a.get(f"partition.{c}") for c in pcols})
                          for a in actions]

    def partitions(self) -> list[InputPartition]:
        return self.parts or [_Whole(-1)]  # an empty table: one partition that yields nothing

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        from bridge.tables.engine import SCHEMAS, conform

        if isinstance(partition, _Whole):
            if partition.version < 0:
                return
            if self.table == "retained_versions":
                yield from self._versions()
                return
            from deltalake import DeltaTable

            dt = DeltaTable(self.path, version=partition.version)
            yield from conform(dt.to_pyarrow_table(), SCHEMAS[self.table]).to_batches()
            return
        import pyarrow.parquet as pq

        rows = pq.read_table(partition.uri)
        for col, value in partition.partition_values.items():
            if col not in rows.column_names:
                typ = SCHEMAS[self.table].field(col).type
                rows = rows.append_column(col, pa.array([value] * rows.num_rows, pa.string()).cast(typ))
        yield from conform(rows, SCHEMAS[self.table]).to_batches()

    def _versions(self) -> Iterator[Any]:
        import pyarrow as pa
        from deltalake import DeltaTable

        from bridge.tables.views import VERSIONS_ARROW, version_rows

        rows = [{**r, "capture_offsets": list(r["capture_offsets"].items()) if r["capture_offsets"] else None}
                for r in version_rows(DeltaTable(self.path).history())]
        yield from pa.Table.from_pylist(rows, schema=VERSIONS_ARROW).to_batches()


class LakegateTable(DataSource):
    """``lakegate_table``: any table, by options (the DataFrame reader's way)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _options(self) -> dict[str, str]:
        return dict(self.options)

    def schema(self) -> str:
        return _schema_ddl(self._options().get("table", ""))

    def reader(self, schema: Any) -> DataSourceReader:
        opts = self._options()
        if not opts.get("delta_dir"):
            raise ValueError("lakegate_table: option delta_dir (the Delta table's directory) is required")
        return _Reader(opts)


#: catalog table -> (table directory under tables_dir, schema)
FIXED = {"messages": ("messages", "messages"), "retained_all": ("retained", "retained"),
         "quarantine": ("quarantine", "quarantine"), "retained_versions": ("retained", "retained_versions")}

#: the environment variable naming the tables' directory for the fixed sources: Spark passes a
#: catalog table's OPTIONS to a Python data source as nothing at all (measured with Spark 4.2),
#: so the endpoint's process sets it before its JVM starts and the Python workers inherit it.
#: Not LAKEGATE_*: those are configuration keys (LAKEGATE_<SECTION>_<KEY>), and a child process
#: (a test's, a benchmark's) would refuse it as an unknown key.
TABLES_DIR_ENV = "LG_ENDPOINT_TABLES_DIR"


def source_class(name: str) -> type[DataSource]:
    """The data source ``lakegate_<name>``: ``table`` -> :class:`LakegateTable`, else one of
    :data:`FIXED`, reading ``$LG_ENDPOINT_TABLES_DIR/<dir>`` whatever the options say."""
    if name == "table":
        return LakegateTable
    table_dir, schema = FIXED[name]

    class Fixed(LakegateTable):
        @classmethod
        def name(cls) -> str:
            return f"lakegate_{name}"

        def _options(self) -> dict[str, str]:
            import os

            root = os.environ.get(TABLES_DIR_ENV)
            if not root:
                raise ValueError(f"lakegate_{name}: {TABLES_DIR_ENV} is not set in this Spark's Python workers "
                                 "(it is set by lakegate run / process for their SQL endpoint)")
            return {**dict(self.options), "delta_dir": os.path.join(root, table_dir), "table": schema}

    Fixed.__name__ = Fixed.__qualname__ = f"Lakegate_{name}"
    return Fixed
