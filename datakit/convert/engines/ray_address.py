"""Check that a Ray address answers before `ray.init` waits on it: `ray.init(address=...)` waits
for the cluster's GCS without a deadline (400 s+ at 127.0.0.1:1 or nohost.invalid:6379).

    check_ray_address("10.0.0.1:6379")   # DatakitError naming the address, within CONNECT_TIMEOUT_S

The GCS (and the Ray Client server behind `ray://`) is a gRPC server: after the HTTP/2
connection preface it sends its SETTINGS frame at once. So the check resolves the host, connects
and sends the preface, all within one deadline, and tells apart: a host that does not resolve,
nothing listening, a server that accepts but never answers (stalled, or firewalled), and a
server that answers something else (a wrong port, e.g. the dashboard's). With TLS on
(RAY_USE_TLS) only the connection is checked. "auto" and "local" are left to Ray.
"""
from __future__ import annotations

import os
import socket
import threading
import time

from datakit.errors import DatakitError

CONNECT_TIMEOUT_S = 20.0  # resolve + connect + first answer; the issue asks for a failure within 30 s
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame
_SETTINGS = 4  # HTTP/2 frame type of the server's first frame


def _resolve(host: str, port: int, timeout: float) -> list[tuple]:
    """getaddrinfo with a deadline (it has none of its own: a dead resolver waits for minutes)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if "infos" in box:
        return box["infos"]  # type: ignore[return-value]
    why = getattr(box.get("error"), "strerror", None) or box.get("error") or f"no answer within {timeout:g} s"
    raise OSError(f"cannot resolve {host} ({why})")


def check_ray_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """DatakitError (one line naming `address`) unless a Ray GCS answers there within `timeout` s."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise DatakitError(f"--ray-address {address}: not host:port (e.g. 10.0.0.1:6379)")
    end = time.monotonic() + timeout
    try:
        family, kind, proto, _, sockaddr = _resolve(host.strip("[]"), int(port), timeout)[0]
        with socket.socket(family, kind, proto) as s:
            s.settimeout(max(0.01, end - time.monotonic()))
            s.connect(sockaddr)
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            s.sendall(_PREFACE)
            head = s.recv(9)
    except TimeoutError:
        raise DatakitError(f"--ray-address {address}: a server there does not answer within {timeout:g} s "
                           "(stalled, firewalled, or not a Ray head)") from None
    except OSError as e:
        raise DatakitError(f"--ray-address {address}: no Ray cluster there ({e.strerror or e}); start one with "
                           "`ray start --head` or fix the address") from None
    if len(head) < 9 or head[3] != _SETTINGS:
        raise DatakitError(f"--ray-address {address}: the server there is not a Ray GCS (it does not speak "
                           "gRPC); the address is the head's GCS port, 6379 by default")
