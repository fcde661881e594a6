#!/usr/bin/env python3
"""tests/server/rawhttp.py: raw-socket clients for tests/server_edges.sh, for what curl cannot
send or do: malformed framing, slow and trickling clients, a client that stops reading. Loopback
only; every wait is bounded. Each command prints one line of JSON for the script to check.

  rawhttp.py send PORT REQUEST [WAIT]      REQUEST with C escapes (\\r \\n \\xNN); reads until
                                           the server closes or WAIT s (default 5) pass:
                                           {"status": 400 | null, "closed": bool, "body": "..."}
  rawhttp.py hold PORT N WAIT              N sockets each send a partial header and stall; after
                                           0.5 s, GET /health from 127.0.0.2 and from 127.0.0.1;
                                           then waits (at most WAIT s) until the server closes all:
                                           {"closed_early": k, "closed": m, "health_other": status,
                                            "health_same": status | null}
  rawhttp.py trickle PORT WAIT             sends a header byte every 0.25 s: {"closed": bool}
  rawhttp.py slowread PORT BODY SLEEP WAIT a streaming POST /v1/completions of BODY with a small
                                           receive buffer, not read for SLEEP s, then read to the
                                           end (at most WAIT s): {"closed": bool, "last": "..."}
"""
import json
import socket
import sys
import time


def unescape(s):
    return s.encode("latin1").decode("unicode_escape").encode("latin1")


def connect(port, source="127.0.0.1", rcvbuf=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, wait):
    """Bytes until the peer closes (closed True) or wait seconds pass."""
    out, end = b"", time.monotonic() + wait
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return out, False
        s.settimeout(left)
        try:
            d = s.recv(65536)
        except socket.timeout:
            return out, False
        except (ConnectionResetError, BrokenPipeError):
            return out, True
        if not d:
            return out, True
        out += d


def status_of(data):
    line = data.split(b"\r\n", 1)[0].split(b" ")
    return int(line[1]) if len(line) > 1 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None


def cmd_send(port, req, wait=5.0):
    s = connect(port)
    s.sendall(unescape(req))
    data, closed = read_all(s, float(wait))
    body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    return {"status": status_of(data), "closed": closed, "body": body.decode("utf8", "replace")}


def health(port, source):
    try:
        s = connect(port, source)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = read_all(s, 5)
        s.close()
        return status_of(data)
    except OSError:
        return None


def cmd_hold(port, n, wait):
    socks = []
    for _ in range(int(n)):
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    t0 = time.monotonic()
    open_ = set(range(len(socks)))

    def reap(until):
        while open_ and time.monotonic() < until:
            for i in list(open_):
                socks[i].settimeout(0.01)
                try:
                    if not socks[i].recv(4096):
                        open_.discard(i)
                except socket.timeout:
                    pass
                except OSError:
                    open_.discard(i)

    reap(t0 + 0.5)
    early = len(socks) - len(open_)
    other = health(port, "127.0.0.2")
    same = health(port, "127.0.0.1")
    reap(t0 + float(wait))
    return {"closed_early": early, "closed": len(socks) - len(open_), "health_other": other, "health_same": same}


def cmd_trickle(port, wait):
    s = connect(port)
    req, end = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Trickle: " + b"a" * 10000, time.monotonic() + float(wait)
    for b in req:
        if time.monotonic() > end:
            return {"closed": False}
        try:
            s.sendall(bytes([b]))
            s.settimeout(0.25)
            if not s.recv(4096):
                return {"closed": True}
        except socket.timeout:
            continue
        except OSError:
            return {"closed": True}
    return {"closed": False}


def cmd_slowread(port, body, sleep, wait):
    s = connect(port, rcvbuf=4096)
    b = body.encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    time.sleep(float(sleep))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # now read at full speed
    data, closed = read_all(s, float(wait))
    events = [ln for ln in data.split(b"\n") if ln.startswith(b"data: ")]
    return {"closed": closed, "status": status_of(data), "last": events[-1].decode() if events else ""}


def main():
    cmd, port, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    fn = {"send": cmd_send, "hold": cmd_hold, "trickle": cmd_trickle, "slowread": cmd_slowread}[cmd]
    print(json.dumps(fn(port, *args)))


if __name__ == "__main__":
    main()
