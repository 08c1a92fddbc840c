"""Capacity estimates in a fleet: the Iceberg table `headroom.capacity_estimates` beside `requests`.

One row per saved estimate, with the columns of the one-box `capacity_estimates` table
(collector.store.estimates.ESTIMATE_COLUMNS: the estimate's JSON and the columns a person filters
on). Unpartitioned: a fleet saves a few rows per model and day.

    save_to_lake(catalog, estimate)      `headroom probe --catalog --lake` (and any writer of an
                                         estimate in fleet mode): one append, retried when another
                                         commit wins the race; a retried append after a lost reply
                                         repeats the estimate_id, which the readers count once
    read_estimates(catalog, models=...)  the rows, as Arrow (none before the first save)
    fleet_decisions(catalog, models=...) collector.store.decision's decide() per model, task
                                         class and replica class over those rows: the same rule
                                         as on one box, so every reader and every sidecar agree
    FleetPublisher                       `headroom run --lake URI --catalog URI`: every minute,
                                         the decisions for the models this sidecar serves, into
                                         its headroom_capacity_* gauges

The readers (`--catalog --lake`: report, integrations, backtest, capacity curve) see these rows
as the `capacity_estimates` table of their store (collector.lake.read), so they publish what the
sidecars publish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BooleanType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from collector.capacity import CapacityEstimate
from collector.lake.layout import Lake
from collector.lake.table import DEFAULT_TABLE, open_catalog
from collector.store.capacity_gauges import CapacityGauges
from collector.store.decision import Decision, PublishPolicy, decisions_from
from collector.store.estimates import ESTIMATE_COLUMNS, candidates_in, estimate_row

__all__ = [
    "ARROW_SCHEMA",
    "ESTIMATES_TABLE",
    "FleetPublisher",
    "estimates_table",
    "fleet_decisions",
    "read_estimates",
    "save_to_lake",
]

log = logging.getLogger(__name__)

ESTIMATES_TABLE = "headroom.capacity_estimates"
_RETRIES = 20

_TYPES: dict[str, tuple[pa.DataType, IcebergType]] = {
    "VARCHAR": (pa.string(), StringType()),
    "TIMESTAMPTZ": (pa.timestamp("us", tz="UTC"), TimestamptzType()),
    "INTEGER": (pa.int32(), IntegerType()),
    "BIGINT": (pa.int64(), LongType()),
    "BOOLEAN": (pa.bool_(), BooleanType()),
}
ARROW_SCHEMA = pa.schema([pa.field(name, _TYPES[kind][0]) for name, kind in ESTIMATE_COLUMNS])
_ICEBERG_SCHEMA = Schema(
    *(
        NestedField(field_id=index + 1, name=name, field_type=_TYPES[kind][1], required=False)
        for index, (name, kind) in enumerate(ESTIMATE_COLUMNS)
    )
)


def estimates_table(requests_table: str = DEFAULT_TABLE) -> str:
    """The estimates table beside a requests table: `headroom.requests` -> `headroom.capacity_estimates`."""
    namespace = requests_table.rsplit(".", 1)[0] if "." in requests_table else "headroom"
    return f"{namespace}.capacity_estimates"


def _open(catalog: Catalog, identifier: str, *, create: bool) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        if not create:
            raise
    try:
        catalog.create_namespace(identifier.rsplit(".", 1)[0])
    except NamespaceAlreadyExistsError:
        pass
    try:
        return catalog.create_table(identifier, schema=_ICEBERG_SCHEMA)
    except TableAlreadyExistsError:  # another writer created it first
        return catalog.load_table(identifier)


def save_to_lake(
    catalog: Catalog,
    estimate: CapacityEstimate,
    identifier: str = ESTIMATES_TABLE,
    *,
    estimate_id: str | None = None,
) -> str:
    """Append one estimate to the fleet's estimates table (created on first use); returns its
    estimate_id."""
    row = estimate_row(estimate, estimate_id)
    rows = pa.Table.from_pylist([row], schema=ARROW_SCHEMA)
    table = _open(catalog, identifier, create=True)
    for attempt in range(_RETRIES):
        try:
            table.refresh().append(rows)
        except CommitFailedException:  # another commit landed first: append on top of it
            time.sleep(min(2.0, 0.05 * 2**attempt))
            continue
        return str(row["estimate_id"])
    raise CommitFailedException(f"{identifier}: {_RETRIES} appends in a row lost the race")


def read_estimates(
    catalog: Catalog, identifier: str = ESTIMATES_TABLE, *, models: Collection[str] | None = None
) -> pa.Table:
    """The saved estimates (of `models` only, when given) as Arrow (ARROW_SCHEMA); none before the
    first save."""
    try:
        table = _open(catalog, identifier, create=False)
    except NoSuchTableError:
        return ARROW_SCHEMA.empty_table()
    if models is not None and not models:
        return ARROW_SCHEMA.empty_table()
    found = table.scan().to_arrow()  # a few rows per model and day: filtered here, not by a string filter
    rows = pa.Table.from_arrays(
        [found[name].cast(ARROW_SCHEMA.field(name).type) for name in ARROW_SCHEMA.names], schema=ARROW_SCHEMA
    )
    if models is None:
        return rows
    return rows.filter(pc.is_in(rows["model"], value_set=pa.array(sorted(models), pa.string())))


def fleet_decisions(
    catalog: Catalog,
    identifier: str = ESTIMATES_TABLE,
    *,
    models: Collection[str] | None = None,
    now: datetime | None = None,
    policy: PublishPolicy | None = None,
) -> list[Decision]:
    """What is published, per model (of `models`), task class and replica class, from the fleet's
    estimates: collector.store.decision's rule over the table's candidates."""
    policy = policy or PublishPolicy()
    candidates = candidates_in(read_estimates(catalog, identifier, models=models), policy.max_error_ratio)
    return decisions_from(candidates, now, policy)


class FleetPublisher:
    """A fleet-mode sidecar's capacity gauges, from the fleet's estimates table.

    `refresh()` (the sidecar's scheduler calls it every minute) opens the catalog on first use,
    decides for the models `models()` names (those this sidecar has served) and replaces the
    gauges. When the catalog or the table cannot be read, the gauges keep what they published
    last and the next refresh tries again (a warning is logged; `last_error` says why).
    """

    def __init__(
        self,
        catalog_uri: str,
        lake_uri: str,
        gauges: CapacityGauges,
        models: Callable[[], Collection[str]],
        *,
        identifier: str = ESTIMATES_TABLE,
        policy: PublishPolicy | None = None,
    ) -> None:
        self.catalog_uri, self.lake = catalog_uri, Lake.parse(lake_uri)
        self.gauges, self.models, self.identifier = gauges, models, identifier
        self.policy = policy or PublishPolicy()
        self.last_error: str | None = None
        self.refreshed = threading.Event()  # set after each refresh that read the table
        self._catalog: Catalog | None = None

    def refresh(self, now: datetime | None = None) -> list[Decision] | None:
        """Publish the decisions for this sidecar's models; None when the table could not be read."""
        models = set(self.models())
        try:
            if self._catalog is None:
                self._catalog = open_catalog(self.catalog_uri, self.lake)
            made = fleet_decisions(self._catalog, self.identifier, models=models, now=now, policy=self.policy)
        except Exception as exc:  # the catalog or the lake is away: keep the gauges, try again next time
            self._catalog, self.last_error = None, f"{type(exc).__name__}: {exc}"
            log.warning(
                "fleet estimates not read from %s (%s); the gauges keep their values",
                self.identifier,
                self.last_error,
            )
            return None
        self.gauges.replace([d.estimate for d in made if d.estimate is not None])
        self.last_error = None
        self.refreshed.set()
        return made
