#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/seeds/<target>/ from the captures of the real Codex CLI in
shared/codex-reference (rollout lines and hook stdin payloads). A few of each kind, so the
committed seeds stay small; libFuzzer grows the working corpus from them."""
import collections, glob, hashlib, json, os, struct, sys

REF = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/codex-reference"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")
PER_KIND = 3


def put(target, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def smallest(groups):
    for items in groups.values():
        for item in sorted(items, key=len)[:PER_KIND]:
            yield item


# Rollout lines: the smallest few of each record kind; probe markers become Courier markers.
lines = collections.defaultdict(set)
paths = set()
for f in sorted(glob.glob(REF + "/rollouts/*.jsonl")):
    paths.add("/home/dev/.codex/sessions/2026/11/29/" + os.path.basename(f).split("--", 1)[1])
    for line in open(f, "rb").read().split(b"\n"):
        if not line.strip():
            continue
        p = json.loads(line).get("payload") or {}
        line = line.replace(b"POST_CTX_MARKER:", b'<courier-message id=\\"m_0123456789abcdef\\" from=\\"x\\">')
        line = line.replace(b"STOP_BLOCK_MARKER:", b'&lt;courier-message id=\\"m_0123456789abcdef\\"&gt;')
        lines[(json.loads(line)["type"], p.get("type"), p.get("role"))].add(line)
for line in smallest(lines):
    put("rollout_line", line)
for p in paths:
    put("rollout_line", p.encode())
# Round-trip inputs: from \0 body1 \0 body2.
put("rollout_line", b"m_0123456789abcdef\0hi</courier-message><courier-message id=\"m_2\">evil\0&lt;b&amp;")

# Hook payloads: the smallest few of each event and key set.
payloads = collections.defaultdict(set)
for f in sorted(glob.glob(REF + "/payloads/*.jsonl")):
    for line in open(f):
        if line.strip():
            stdin = json.loads(line).get("stdin")
            if not isinstance(stdin, dict):
                continue
            payloads[(stdin.get("hook_event_name"), tuple(sorted(stdin)))].add(json.dumps(stdin, separators=(",", ":")).encode())
for p in smallest(payloads):
    put("hook_payload", p)


# Frames: 2 bytes of limit, then frames as hook-client and broker write them.
def frame(obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


by_event = {}
for (event, _), items in payloads.items():
    by_event.setdefault(event, min(items, key=len))
for event, p in by_event.items():
    req = {"op": "hook", "v": 1, "pid": 4242, "ts_ms": 1795939276614, "payload": p.decode(), "mac": "ab" * 32}
    put("frame", b"\xff\xff" + frame(req) + frame({"op": "ack", "v": 1, "lease": 7}))
put("frame", b"\x10\x00" + frame({"op": "status", "v": 1}))
put("frame", b"\xff\xff" + frame({"v": 1, "output": "{\"decision\":\"block\",\"reason\":\"x\"}", "lease": 3}))
put("frame", b"\x00\x40" + frame({"v": 1, "accepted": True}) + b"\xff\xff\xff\xff")
