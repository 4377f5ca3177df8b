#!/usr/bin/env python3
"""A local webhook receiver for the demo (standard library only): prints every request it gets
and answers 200, or 503 for the first N requests.

    python3 examples/webhook_receiver.py --port 8787 --fail-first 2
"""

import argparse
import http.server
import threading


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--fail-first", type=int, default=0, help="answer the first N requests with 503")
    args = parser.parse_args()
    failures_left = [args.fail_first]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                status = 503 if failures_left[0] > 0 else 200
                failures_left[0] -= 1
            answer = b"upstream unavailable" if status == 503 else b""
            self.send_response(status)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            print(f"receiver: {status} for {self.headers.get('outbox-topic')} webhook-id={self.headers.get('webhook-id')} "
                  f"attempt={self.headers.get('outbox-attempt')} body={body.decode()}", flush=True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"receiver: listening on http://127.0.0.1:{args.port}/hooks", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()


if __name__ == "__main__":
    main()
