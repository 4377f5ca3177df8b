#!/usr/bin/env python3
"""A local webhook receiver for the tests (standard library only).

It records every request (headers, body, when it arrived) and answers from a script of
responses, then with a default: enough to play a healthy endpoint, a failing one, a slow one
or one that is down (stopped).
"""

import collections
import http.server
import threading
import time


class Receiver:
    """A threaded HTTP server on 127.0.0.1 that records requests and answers as told."""

    def __init__(self, port: int = 0, quiet: bool = True):
        self.requests = []
        self.started = 0  # requests whose handling began (a slow answer may still be pending)
        self.concurrent = 0  # requests being handled now
        self.max_concurrent = 0  # the most handled at once since start (or reset_concurrency)
        self._script = collections.deque()
        self._default = (200, 0.0, {}, b"")
        self._decide = None  # a function of nothing returning an answer, when set
        self._changed = threading.Condition()
        self._port = port
        self._quiet = quiet
        self._server = None

    # -- behaviour -------------------------------------------------------------------------
    def answer(self, status: int = 200, delay: float = 0.0, headers=None, body: bytes = b"", times: int = 1):
        """The next `times` requests get this answer; later ones the default."""
        with self._changed:
            self._script.extend([(status, delay, headers or {}, body)] * times)

    def answer_by_default(self, status: int = 200, delay: float = 0.0, headers=None, body: bytes = b""):
        with self._changed:
            self._default = (status, delay, headers or {}, body)
            self._decide = None

    def answer_with(self, decide):
        """Every request is answered with what decide() returns: (status, delay, headers, body),
        where status "cut" sends the start of a status line and closes the connection."""
        with self._changed:
            self._decide = decide

    # -- life ------------------------------------------------------------------------------
    def start(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                arrived_at = time.time()
                with receiver._changed:
                    receiver.started += 1
                    receiver.concurrent += 1
                    receiver.max_concurrent = max(receiver.max_concurrent, receiver.concurrent)
                    if receiver._script:
                        status, delay, headers, answer = receiver._script.popleft()
                    elif receiver._decide:
                        status, delay, headers, answer = receiver._decide()
                    else:
                        status, delay, headers, answer = receiver._default
                    receiver._changed.notify_all()
                if delay:
                    time.sleep(delay)
                record = {
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body.decode(),
                    "status": status,
                    "arrived_at": arrived_at,
                    "received_at": time.time(),
                    "client_port": self.client_address[1],  # one per connection the sender opened
                }
                # Noted before the answer goes out: whoever acts on the answer (the worker records
                # the delivery) must find the request here when it is done. And no longer counted
                # as in hand: a sender that got the answer may send its next request at once, and
                # on a starved machine this thread could still be on its way to count the first
                # one done when the next arrives (two "at once" that never were).
                with receiver._changed:
                    receiver.requests.append(record)
                    receiver.concurrent -= 1
                    receiver._changed.notify_all()
                try:
                    if status == "cut":  # the connection dies in the middle of the answer
                        self.wfile.write(b"HTTP/1.1 2")
                        self.close_connection = True
                    else:
                        self.send_response(status)
                        for name, value in headers.items():
                            self.send_header(name, value)
                        self.send_header("content-length", str(len(answer)))
                        self.end_headers()
                        self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    with receiver._changed:
                        record["status"] = "client gone"  # the sender timed out first
                if not receiver._quiet:
                    print(
                        f"receiver: {status} for {record['headers'].get('outbox-topic')} "
                        f"webhook-id={record['headers'].get('webhook-id')} "
                        f"attempt={record['headers'].get('outbox-attempt')} body={record['body']}",
                        flush=True,
                    )

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that hangs up (a sender's timeout) is part of the game

        self._server = Server(("127.0.0.1", self._port), Handler)
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def stopped(self) -> bool:
        return self._server is None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/hooks"

    # -- observation -----------------------------------------------------------------------
    def reset_concurrency(self):
        """Starts counting the most requests handled at once afresh (from those in hand now)."""
        with self._changed:
            self.max_concurrent = self.concurrent

    def wait_for(self, count: int, timeout: float = 15.0, started: bool = False):
        """Blocks until `count` requests got their answer (or began, with started=True); a
        request is noted just before its answer is written."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while (self.started if started else len(self.requests)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = self.started if started else len(self.requests)
                    raise TimeoutError(f"receiver saw {seen} of {count} requests in {timeout}s")
                self._changed.wait(remaining)
            return list(self.requests)
