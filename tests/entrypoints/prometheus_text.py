"""Read values out of a /metrics page (Prometheus text format) by sample name and labels."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` whose labels include `labels`; None when there is none."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def engine_gauges(url: str) -> dict[str, float]:
    """A server's requests running and waiting and its KV cache usage, from its /metrics page."""
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    values = {}
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            values[name] = float(line.rsplit(" ", 1)[1])
    assert set(values) == set(wanted), values
    return values
