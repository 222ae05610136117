"""A tiny HTTP proxy in front of the test S3 server that answers 503 SlowDown to the next N
requests for objects whose key ends with a given suffix: a server that returns errors for a
while, over real HTTP, for the retry tests. `fail_next(..., status=403, code="InvalidAccessKeyId")`
answers another S3 error instead (a server refusing these credentials)."""
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

MESSAGES = {"SlowDown": "Please reduce your request rate.",
            "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records.",
            "AccessDenied": "Access Denied"}


def error_body(code: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{MESSAGES[code]}</Message></Error>").encode()


class FlakyProxy:
    def __init__(self, upstream: str):
        self.upstream = urlparse(upstream)
        self.fail_left, self.suffix, self.failed = 0, "", 0
        self.status, self.code = 503, "SlowDown"
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    fail = proxy.fail_left > 0 and self.path.split("?")[0].endswith(proxy.suffix)
                    if fail:
                        proxy.fail_left -= 1
                        proxy.failed += 1
                if fail:
                    body = error_body(proxy.code)
                    self.send_response(proxy.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has headers only
                        self.wfile.write(body)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD: the upstream's Content-Length is the object's size, not this empty body's
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail_next(self, n: int, suffix: str, status: int = 503, code: str = "SlowDown") -> None:
        with self.lock:
            self.fail_left, self.suffix, self.failed = n, suffix, 0
            self.status, self.code = status, code

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
