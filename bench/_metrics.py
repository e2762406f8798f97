"""Reading the server's Prometheus metrics: snapshots, differences, percentiles."""

from __future__ import annotations

import dataclasses
import math

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass
class Snapshot:
    """Counter/gauge values by (name, labels) and histogram buckets by name."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    buckets: dict[str, list[tuple[float, float]]]  # name -> [(upper bound, cumulative count)]

    def value(self, name: str, **labels: str) -> float:
        return self.values.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str) -> float:
        return sum(v for (n, _), v in self.values.items() if n == name)


def scrape(http_url: str) -> Snapshot:
    return parse(httpx.get(http_url + "/metrics", timeout=10).text)


async def fetch_text(http_url: str, path: str = "/metrics") -> str:
    """The raw ``/metrics`` text (or another GET's) over a plain socket, on the caller's event loop.

    For load generators: an HTTP client in a thread (TLS context, parsing)
    would hold the GIL long enough to delay every client's next page at once.
    Parse the text later with :func:`parse`.
    """
    import urllib.parse

    import trio

    url = urllib.parse.urlsplit(http_url)
    stream = await trio.open_tcp_stream(url.hostname or "127.0.0.1", url.port or 80)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += await _receive(stream)
        head, _, body = data.partition(b"\r\n\r\n")
        status, *headers = head.decode("latin-1").split("\r\n")
        if status.split()[1:2] != ["200"]:
            raise RuntimeError(f"{path} answered {status!r}")
        fields = dict(line.lower().split(":", 1) for line in headers if ":" in line)
        length = int(fields.get("content-length", "-1"))
        # hypercorn keeps the socket open after the body: read exactly its length.
        while len(body) < length:
            body += await _receive(stream)
    return body.decode()


async def _receive(stream: object) -> bytes:
    data = await stream.receive_some(1 << 16)  # type: ignore[attr-defined]
    if not data:
        raise RuntimeError("the server closed the connection before the whole /metrics answer")
    return data


def parse(text: str) -> Snapshot:
    values, buckets = {}, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                others = sorted((k, v) for k, v in sample.labels.items() if k != "le")
                key = sample.name[: -len("_bucket")] + "".join(f"|{k}={v}" for k, v in others)
                buckets.setdefault(key, []).append((bound, sample.value))
            else:
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    for series in buckets.values():
        series.sort()
    return Snapshot(values, buckets)


@dataclasses.dataclass
class Histogram:
    """The observations of one histogram between two snapshots."""

    bounds: list[float]
    counts: list[float]  # cumulative

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot, name: str, **labels: str) -> Histogram:
        key = name + "".join(f"|{k}={v}" for k, v in sorted(labels.items()))
        b = dict(before.buckets.get(key, []))
        a = after.buckets.get(key, [])
        return cls([bound for bound, _ in a], [count - b.get(bound, 0.0) for bound, count in a])

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket, as Prometheus' histogram_quantile does."""
        if not self.count:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts):
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                width = count - lower_count
                return lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 0)
            lower_bound, lower_count = bound, count
        return lower_bound

    def cdf(self) -> tuple[list[float], list[float]]:
        finite = [(b, c) for b, c in zip(self.bounds, self.counts) if not math.isinf(b)]
        total = self.count or 1.0
        return [0.0] + [b for b, _ in finite], [0.0] + [c / total for _, c in finite]
