"""Prometheus's HTTP API, the one call the fleet judge makes: ``/api/v1/query_range`` (a matrix of
series sampled every ``step`` seconds). Nothing else reaches the nodes: Prometheus scraped them."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

MAX_RESPONSE_BYTES = 64 << 20  # a selector matching far more than a fleet's histograms is an error, not a read


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or did not answer with a matrix."""


@dataclass(frozen=True)
class Series:
    """One series: its labels and its (time, value) samples, in time order."""

    labels: dict
    samples: list[tuple[float, float]]


def check_url(url: str) -> str:
    """The base URL of a Prometheus server (http or https, a host), without a trailing slash."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PrometheusError(f"{url!r} is not an http(s) URL of a Prometheus server, such as http://prometheus:9090")
    return url.rstrip("/")


def query_range(url: str, query: str, start: float, end: float, step: float, timeout: float = 30.0) -> list[Series]:
    """The series ``query`` gives between ``start`` and ``end`` (Unix times), every ``step`` seconds."""
    if not (math.isfinite(start) and math.isfinite(end) and end > start and step > 0):
        raise PrometheusError(f"a range from {start} to {end} every {step} s is not one Prometheus can answer")
    address = f"{check_url(url)}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    try:
        with urllib.request.urlopen(address, timeout=timeout) as response:
            body = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as err:  # Prometheus says why in its JSON body (a bad query: 400)
        body = err.read(65536)
        raise PrometheusError(f"{url}: HTTP {err.code}: {_error_of(body) or err.reason}") from err
    except (urllib.error.URLError, OSError) as err:
        raise PrometheusError(f"{url}: cannot ask Prometheus: {getattr(err, 'reason', err)}") from err
    if len(body) > MAX_RESPONSE_BYTES:
        raise PrometheusError(f"{url}: the answer to {query!r} is over {MAX_RESPONSE_BYTES >> 20} MiB: narrow the selector")
    return parse_matrix(body)


def parse_matrix(body: bytes) -> list[Series]:
    """The series of a query_range answer; PrometheusError for anything but a successful matrix."""
    try:
        answer = json.loads(body)
    except ValueError as err:
        raise PrometheusError(f"the answer is not JSON: {err}") from err
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise PrometheusError(f"the query failed: {_error_of(body) or 'no status success'}")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PrometheusError("the answer is not a matrix (query_range of a range vector selector?)")
    found = []
    for item in data["result"]:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            samples = [(float(t), float(v)) for t, v in item["values"]]
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise PrometheusError(f"a series of the answer cannot be read: {err}") from err
        found.append(Series(labels, samples))
    return found


def _error_of(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return ""
    return str(answer.get("error", ""))[:300] if isinstance(answer, dict) else ""
