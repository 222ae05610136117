"""Retries for object-storage calls: exponential backoff on transient errors, then one error
that names the URL, the attempts and the last cause.

Transient: connection resets, timeouts, throttling and 5xx answers (botocore/aiohttp errors and
the OSErrors s3fs turns them into). Permanent, raised at once: a missing object, a refused
permission or missing credentials (StorageError naming the URL and what to set, `access`), an
offline Hub, any DatakitError (e.g. a download's local disk being full: `transfer`).
The delays grow as base * 2**k with +-25% jitter (so ranks that failed together do not retry
together), capped at `max_delay`.

These are the only retries: `urls.filesystem` turns off the ones botocore and s3fs would nest
inside each attempt (5 x 5 of them, which made a dead endpoint take ~90 s), and gives each
attempt `timeout` seconds to connect and between two reads, so a server that stops answering
fails the attempt instead of hanging; each call of an async filesystem (s3fs) also gets a whole
deadline (`deadline`: 3 x timeout plus its bytes at `min_rate`), after which fsspec cancels it.
With the defaults a dead endpoint fails after the four delays, 0.5 + 1 + 2 + 4 = 7.5 s (+-25%);
a stalled one after at most 5 deadlines (30 s each for a small object) plus the same 7.5 s.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from datakit.errors import DatakitError, StorageError
from datakit.storage.access import refusal

T = TypeVar("T")

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_TRANSIENT_NAMES = ("Throttl", "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable",
                    "ConnectionError", "Timeout", "ServerDisconnected", "ClientPayloadError",
                    "IncompleteRead", "EndpointConnectionError", "ResponseStreamingError")
# botocore's and aiohttp's connection failures (ConnectionClosedError, ReadTimeoutError, ...): with
# their own retries off (`urls.s3_options`), datakit must retry what they did; httpx's (huggingface_hub's
# client: ConnectError, ReadTimeout, RemoteProtocolError, ...), which are no ConnectionError
_CONNECTION_CLASSES = {"HTTPClientError", "ClientConnectionError", "ClientOSError", "TransportError"}


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the same call may succeed a moment later."""
    if isinstance(exc, (DatakitError, *_PERMANENT)):
        return False
    name = type(exc).__name__
    if name == "OfflineModeIsEnabled":  # a ConnectionError subclass that no retry will fix
        return False
    status = getattr(getattr(exc, "response", None), "status_code", None)  # huggingface_hub / requests
    if isinstance(status, int):
        return status >= 500 or status == 429
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if _CONNECTION_CLASSES & {c.__name__ for c in type(exc).__mro__}:  # what botocore itself retried
        return True
    if any(t in name or t in str(exc)[:200] for t in _TRANSIENT_NAMES):
        return True
    # s3fs maps unknown botocore failures to a bare OSError; unknown I/O failures are retried
    return type(exc) is OSError


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # calls in all, the first included
    base_delay: float = 0.5  # seconds before the first retry
    max_delay: float = 20.0  # cap on one delay
    jitter: float = 0.25  # relative +- randomisation of each delay
    timeout: float = 10.0  # seconds one attempt may wait to connect, or for the server's next bytes
    min_rate: float = float(1 << 20)  # bytes/s: a transfer slower than this is stalled (its deadline)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)  # tests record it

    def __post_init__(self):
        if self.attempts < 1 or not self.timeout > 0 or not self.min_rate > 0:
            raise ValueError(f"RetryPolicy needs attempts >= 1, timeout > 0 and min_rate > 0, got {self.attempts}, "
                             f"{self.timeout}, {self.min_rate}")

    def deadline(self, nbytes: int = 0) -> float:
        """Seconds one attempt of a call moving `nbytes` may take in all: the backstop for a wait
        that no socket timeout covers (e.g. an upload waiting for "100 Continue")."""
        return 3 * self.timeout + nbytes / self.min_rate

    def delay(self, retry: int) -> float:
        d = min(self.base_delay * (2 ** retry), self.max_delay)
        return d * (1 + self.jitter * (2 * random.random() - 1))


DEFAULT_RETRY = RetryPolicy()


def with_retries(call: Callable[[], T], url: str, what: str, policy: RetryPolicy = DEFAULT_RETRY) -> T:
    """`call()`, retried on transient errors; StorageError naming `url` when it keeps failing.
    A refused permission or missing credentials raise StorageError naming `url` and what to
    set at the first attempt; other permanent errors (a missing object) propagate unchanged."""
    for attempt in range(policy.attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if (denied := refusal(exc, url)) is not None:
                raise denied from None
            if not is_transient(exc):
                raise
            if attempt + 1 >= policy.attempts:
                said = str(exc) or "no answer within the deadline"
                raise StorageError(url, f"{what} failed {policy.attempts} times, giving up "
                                        f"(last error: {type(exc).__name__}: {said})") from exc
            policy.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")
