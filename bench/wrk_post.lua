-- wrk: POST the same booking snapshot the worker sends.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("OUTBOX_BENCH_PAYLOAD")
