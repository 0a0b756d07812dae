"""Samples the fleet fairness state in Redis (issue 34's measurement): every INTERVAL seconds,
in one atomic call, Redis's clock, every tenant's service counter (`<base>:service`) and who
waits where (`<base>:waiting`), appended to OUT as one JSON line each:
{"t": epoch seconds (Redis), "service": {field: tokens over share}, "waiting": {entry: until ms}}.
  python3 fleet_sampler.py PORT BASE OUT [INTERVAL]   (runs until killed)"""
import json
import socket
import sys
import time

port, base, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
SCRIPT = ("local t = redis.call('TIME') "
          "return {t[1], t[2], redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}")


def command(*args):
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        a = str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


class Reader:
    def __init__(self, sock):
        self.f = sock.makefile("rb")

    def read(self):
        line = self.f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode()
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise RuntimeError(rest.decode())
        return rest.decode()


def pairs(flat):
    return {flat[i]: float(flat[i + 1]) for i in range(0, len(flat), 2)}


sock = socket.create_connection(("127.0.0.1", port))
reader = Reader(sock)
with open(out, "a") as f:
    while True:
        sock.sendall(command("EVAL", SCRIPT, 2, f"{base}:service", f"{base}:waiting"))
        secs, micros, service, waiting = reader.read()
        f.write(json.dumps({"t": int(secs) + int(micros) / 1e6, "service": pairs(service),
                            "waiting": pairs(waiting)}) + "\n")
        f.flush()
        time.sleep(interval)
