"""``GET /metrics`` of ``fusee.http.app``: ``Engine.metrics()`` in the Prometheus text format.

Needs ``prometheus_client`` (the optional extra ``fusee[prometheus]``). Each
scrape takes one snapshot of the engine (a walk of the workflow table, on the
engine's loop) and renders it: nothing is kept between scrapes, so any number
of apps may serve one engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fusee.engine.visibility import STATUSES

#: The Content-Type of the answer.
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _Snapshot:
    """A collector that reports one ``Metrics`` snapshot."""

    def __init__(self, m: Any) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        runs = GaugeMetricFamily("fusee_runs", "Workflows by status", labels=["status"])
        total = dict.fromkeys(STATUSES, 0)
        for shard in m.shards:
            for status, n in shard.runs.items():
                total[status] = total.get(status, 0) + n
        for status, n in total.items():
            runs.add_metric([status], n)
        yield runs
        gauges = [
            ("fusee_runs_parked", "Unfinished runs whose code is out of memory", sum(s.parked for s in m.shards)),
            ("fusee_runs_loaded", "Runs whose code is in memory", sum(s.loaded for s in m.shards)),
            ("fusee_loaded_bytes", "Bytes the loaded runs are counted as holding (docs/operations.md)",
             m.loaded_bytes),
            ("fusee_runs_to_load", "Unfinished runs recovery has still to load", m.runs_to_load),
            ("fusee_steps_executing", "Step functions running now", m.steps_executing),
            ("fusee_steps_gated", "Steps waiting for their run's records to become durable", m.steps_gated),
            ("fusee_timers_pending", "Timers, deadlines and park checks queued", m.timers_pending),
            ("fusee_records_pending", "Records appended and not yet flushed", m.records_pending),
            ("fusee_indexed", "Workflows with search attributes", m.indexed),
            ("fusee_flush_p50_seconds", "Median time of the latest flushes (write + fdatasync)",
             m.flush_p50_ms / 1000),
            ("fusee_flush_p99_seconds", "99th percentile time of the latest flushes", m.flush_p99_ms / 1000),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        counters = [
            ("fusee_steps_run", "Step functions run to an outcome since the open", m.steps_run),
            ("fusee_flushes", "Log flushes completed since the open", m.flushes),
            ("fusee_inline_flushes", "Of them, flushes run on the loop's thread", m.inline_flushes),
            ("fusee_records_flushed", "Records made durable since the open", m.records_flushed),
        ]
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        durable = GaugeMetricFamily("fusee_durable_lsn", "The shard's last durable log position", labels=["shard"])
        for shard in m.shards:
            durable.add_metric([str(shard.shard)], shard.durable_lsn)
        yield durable


def render(metrics: Any) -> bytes:
    """``metrics`` (an ``Engine.metrics()`` snapshot) in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    data: bytes = generate_latest(registry)
    return data
