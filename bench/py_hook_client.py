"""A Python-stdlib hook client doing hook-client's socket round trip (bench case 3 only).

Same frame (4-byte big-endian length + JSON), same HMAC-SHA256 (shared/src/auth.rs), same
request. The broker REFUSES it (`client_exe`: only the installed hook-client executable may call),
which is expected: the benchmark times the round trip, and the refusal is decided at gate step 2,
so the broker spends less on it than on a verified call.
"""
import hashlib, hmac, json, os, socket, struct, sys, time

payload = sys.stdin.buffer.read()
rt = os.environ.get("COURIER_RUNTIME_DIR") or os.path.join(os.environ["XDG_RUNTIME_DIR"], "courier")
with open(os.path.join(rt, "secret"), "rb") as f:
    secret = f.read(32)
pid, ts = os.getpid(), int(time.time() * 1000)
mac = hmac.new(secret, b"courier-hook-v1\0" + struct.pack(">IQ", pid, ts) + payload, hashlib.sha256).hexdigest()
req = json.dumps({"op": "hook", "v": 1, "pid": pid, "ts_ms": ts, "payload": payload.decode(), "mac": mac}).encode()
s = socket.socket(socket.AF_UNIX)
s.settimeout(0.5)
s.connect(os.path.join(rt, "broker.sock"))
s.sendall(struct.pack(">I", len(req)) + req)

def read_exact(n):
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise EOFError
        buf += b
    return buf

reply = json.loads(read_exact(struct.unpack(">I", read_exact(4))[0]))
if reply.get("output"):
    sys.stdout.write(reply["output"])
