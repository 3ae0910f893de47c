"""Read values out of a /metrics page (Prometheus text format) by sample name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` whose labels include `labels`; None when there is none."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None
