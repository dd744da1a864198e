"""Stand-in Codex process for the Courier benchmarks.

Run by a COPY of the system python3 with a few unique bytes appended, named `codex` and trusted by
digest (`broker trust-codex`): the broker's gate sees a trusted Codex executable, exactly as with
the real CLI. Like Codex it holds each thread's rollout open O_WRONLY|O_APPEND and an exclusive
flock on $CODEX_HOME/thread-writer-locks/<thread>.lock, spawns each hook as its own child (own
session, payload on stdin, stdout on a pipe) and appends delivered hook context to the rollout.

It reads JSON commands on stdin and answers one JSON line each. Timing is taken HERE, around each
spawn: perf_counter_ns before posix_spawn, after wait4 -- child start to exit, nothing else. The
/bin/true reference is spawned the same way, by the same process, with the same pipes.
"""
import itertools
import json
import os
import sys
import threading
import time

held_fds = []  # extra open files (op "fds")
threads = {}   # thread id -> {"fd": rollout fd (O_APPEND), "lock": lock fd, "turn": open turn}
log_fd = os.open(os.environ.get("COURIER_BENCH_CHILD_LOG", "/dev/null"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def spawn_timed(argv, stdin_bytes):
    """Runs argv with stdin_bytes on a pipe; returns (ns, exit status, stdout bytes, maxrss KiB)."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.write(w_in, stdin_bytes)   # payloads are far below the pipe buffer: never blocks
    os.close(w_in)
    actions = [
        (os.POSIX_SPAWN_DUP2, r_in, 0),
        (os.POSIX_SPAWN_DUP2, w_out, 1),
        (os.POSIX_SPAWN_DUP2, log_fd, 2),
    ]
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    _, status, ru = os.wait4(pid, 0)
    t1 = time.perf_counter_ns()
    os.close(r_in)
    os.close(w_out)
    chunks = []
    while True:
        b = os.read(r_out, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r_out)
    return t1 - t0, os.waitstatus_to_exitcode(status), b"".join(chunks), ru.ru_maxrss


def hook_context_line(text, turn):
    rec = {
        "timestamp": "2026-11-29T08:08:53.000Z",
        "type": "response_item",
        "payload": {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": text}],
            "internal_chat_message_metadata_passthrough": {
                "turn_id": turn,
                "content_item_kinds": ["hooks.additional_context"],
                "content_item_metadata": [{"provenance": {"type": "harness", "hook": True}}],
            },
        },
    }
    return (json.dumps(rec) + "\n").encode()


def deliver(thread, out):
    """Like Codex: a hook's additionalContext becomes a developer message in the rollout."""
    if not out:
        return None
    ctx = json.loads(out)["hookSpecificOutput"]["additionalContext"]
    t = threads[thread]
    os.write(t["fd"], hook_context_line(ctx, t["turn"]))
    return ctx


def marker_ids(text):
    ids, key = [], '<courier-message id="'
    at = text.find(key)
    while at >= 0:
        end = text.find('"', at + len(key))
        ids.append(text[at + len(key):end])
        at = text.find(key, end)
    return ids


CALL_IDS = itertools.count(1)


def record(kind, payload):
    return (json.dumps({"timestamp": "2026-11-29T08:08:53.000Z", "type": kind, "payload": payload}) + "\n").encode()


def payload_for(template, thread):
    """The payload of the next hook of `thread`. Like Codex, a PostToolUse follows its own tool
    call: the call and its item_completed are written first (the broker binds each hook to that
    state, once: gate/ticket.rs), its output after the hook (`answered`)."""
    p = dict(template)
    t = threads[thread]
    p["session_id"] = thread
    p["turn_id"] = t["turn"]
    p["transcript_path"] = t["path"]
    if p.get("hook_event_name") == "PostToolUse":
        call = "call_bench_%d" % next(CALL_IDS)
        p["tool_use_id"] = call
        os.write(t["fd"], record("response_item", {"type": "function_call", "name": "exec_command", "arguments": "{}",
                                                   "call_id": call, "internal_chat_message_metadata_passthrough": {"turn_id": t["turn"]}}))
        os.write(t["fd"], record("event_msg", {"type": "item_completed", "thread_id": thread, "turn_id": t["turn"],
                                               "item": {"type": "CommandExecution", "id": call}}))
    return json.dumps(p).encode(), p.get("tool_use_id")


def answered(thread, call):
    """After the hook: Codex writes the tool call's output."""
    if call:
        os.write(threads[thread]["fd"], record("response_item", {"type": "function_call_output", "call_id": call, "output": "ok"}))


def load(c):
    """`workers` concurrent hook clients for `seconds`, round-robin over the held threads."""
    order = list(threads)
    state = {"next": 0, "lat": [], "errors": [], "ids": [], "calls": 0}
    mu = threading.Lock()
    stop_at = time.monotonic() + c["seconds"]

    def worker():
        while time.monotonic() < stop_at:
            with mu:
                thread = order[state["next"] % len(order)]
                state["next"] += 1
            data, call = payload_for(c["template"], thread)
            ns, code, out, _ = spawn_timed(c["argv"], data)
            answered(thread, call)
            ids = []
            try:
                ctx = deliver(thread, out)
                ids = marker_ids(ctx) if ctx else []
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                with mu:
                    state["errors"].append(f"bad output {out[:200]!r}: {e!r}")
            with mu:
                state["calls"] += 1
                state["lat"].append(ns)
                state["ids"].extend(ids)
                if code != 0:
                    state["errors"].append(f"exit {code}")

    ws = [threading.Thread(target=worker) for _ in range(c["workers"])]
    t0 = time.monotonic()
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    state["wall_s"] = time.monotonic() - t0
    del state["next"]
    return state


for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    try:
        if op == "hold":
            # Open the rollout for append and take the thread's writer lock, as Codex does.
            import fcntl
            fd = os.open(c["path"], os.O_WRONLY | os.O_APPEND)
            lk = os.open(c["lock"], os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)
            threads[c["thread"]] = {"fd": fd, "lock": lk, "turn": c["turn"], "path": c["path"]}
            reply({"ok": True, "pid": os.getpid()})
        elif op == "run":
            # One timed spawn per entry of `seq` ({"argv": [...], "thread": id or null}).
            res = []
            for s in c["seq"]:
                if s.get("gap_ms"):
                    time.sleep(s["gap_ms"] / 1000)  # hooks come seconds apart in a real session
                data, call = payload_for(c["template"], s["thread"]) if s.get("thread") else (b"{}", None)
                ns, code, out, rss = spawn_timed(s["argv"], data)
                if call:
                    answered(s["thread"], call)
                ids = []
                if s.get("thread") and c.get("deliver"):
                    ctx = deliver(s["thread"], out)
                    ids = marker_ids(ctx) if ctx else []
                res.append({"ns": ns, "code": code, "out_len": len(out), "rss_kib": rss, "ids": ids})
            reply({"ok": True, "res": res})
        elif op == "rss":
            # Peak RSS via GNU time (it forks, so the child's high-water mark does not start from
            # this Python process's, as posix_spawn's vfork would make it).
            import subprocess
            data, call = payload_for(c["template"], c["thread"]) if c.get("thread") else (b"{}", None)
            r = subprocess.run(["/usr/bin/time", "-f", "%M", *c["argv"]], input=data, capture_output=True)
            if call:
                answered(c["thread"], call)
            reply({"ok": True, "kib": int(r.stderr.decode().strip().splitlines()[-1]), "code": r.returncode})
        elif op == "load":
            reply({"ok": True, **load(c)})
        elif op == "fds":
            # Hold `n` more open files, as a long session's codex does (sockets, pipes, rollouts).
            held_fds.extend(os.open("/dev/null", os.O_RDONLY) for _ in range(c["n"]))
            reply({"ok": True, "open": len(os.listdir("/proc/self/fd"))})
        elif op == "pid":
            reply({"ok": True, "pid": os.getpid()})
        else:
            reply({"error": f"unknown op {op}"})
    except Exception as e:  # noqa: BLE001 - the driver shows it
        reply({"error": repr(e)})
