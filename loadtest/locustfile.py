"""The seeded tutoring mix (M5) for Locust, timing TTFT on the gateway's /answer SSE stream.

    locust -f loadtest/locustfile.py --headless -u 20 -r 20 -t 15m --host http://127.0.0.1:8080

Each user picks a class by share (70% 300/120, 25% 2,000/300, 5% 8,000/500 tokens) from a seeded
generator (LOAD_SEED, default 42) and reports two entries per request: "TTFT <class>" (send to
first `event: token`) and "e2e <class>" (send to `event: done`). An `error` event or a non-200
status is a failure.
"""
import os
import random
import time

from locust import HttpUser, constant, events, task

CLASSES = [("small", 300, 120, 0.70), ("medium", 2000, 300, 0.25), ("large", 8000, 500, 0.05)]
WORDS = "why does my loop not end when i set the flag in the next call this code fn let map key".split()
SEED = int(os.environ.get("LOAD_SEED", "42"))
_counter = 0


def prompt(rng, tokens):
    # One short word is one token for the simulator's heuristic; minus ~10 for the chat template.
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens - 10)))


class Student(HttpUser):
    wait_time = constant(0)

    def on_start(self):
        global _counter
        _counter += 1
        self.rng = random.Random(SEED * 1000 + _counter)

    def fire(self, name, ms, exc=None):
        events.request.fire(request_type="SSE", name=name, response_time=ms,
                            response_length=0, exception=exc, context={})

    @task
    def ask(self):
        r = self.rng.random()
        for name, inp, out, share in CLASSES:
            r -= share
            if r < 0:
                break
        body = {"messages": [{"role": "user", "content": prompt(self.rng, inp)}],
                "max_output_tokens": out}
        start = time.perf_counter()
        first = None
        event = None
        with self.client.post("/answer", json=body, stream=True, catch_response=True,
                              name=f"POST /answer {name}") as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
                return
            for line in resp.iter_lines(decode_unicode=True):
                if line.startswith("event:"):
                    event = line[6:].strip()
                    if event == "token" and first is None:
                        first = time.perf_counter()
                        self.fire(f"TTFT {name}", (first - start) * 1000)
                    elif event == "error":
                        resp.failure("error event")
                        return
                    elif event == "done":
                        break
            if event != "done":
                resp.failure("stream ended without done")
                return
            resp.success()
            self.fire(f"e2e {name}", (time.perf_counter() - start) * 1000)
