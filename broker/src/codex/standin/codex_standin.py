"""The stand-in Codex: the one script every test and bench runs when it needs a Codex process the
broker's gate accepts without the real CLI.

It runs on `broker::codex::standin`'s executable, a copy of the system python3 with bytes unique to the
test process appended, named `codex` and trusted by digest (`broker trust-codex`), so the gate
sees a trusted Codex binary exactly as with the real CLI:

    codex -c "$SCRIPT" MODE ARGS...           Rust (`broker::codex::standin::SCRIPT`, include_str!)
    codex path/to/codex_standin.py MODE ...   bench/driver.py (stdlib Python, no Rust build)

Like Codex it writes each thread's rollout under $CODEX_HOME/sessions/ (opened O_APPEND, compact
JSON with ordinals), holds $CODEX_HOME/thread-writer-locks/<thread>.lock flocked, runs each hook
as its own child (own session, payload on stdin) and appends what Codex would for the hook's
output: a developer message with `content_item_kinds: ["hooks.additional_context"]`, or for a
Stop block a `<hook_prompt>` user message with the reason XML-escaped. So the rollout is the
ground truth of what "the model" saw.

Modes:
    turns HOME THREAD HOOK_CLIENT EXTRA_ENV STOP_FILE TOOLS_PER_TURN
        whole turns of tool calls and their hooks (each call's record printed) until STOP_FILE
        exists; then `{"stopped": true, "hooks": N}` (the kit's crash, hostile and follow tests).
    stepped HOME THREAD HOOK_CLIENT EXTRA_ENV
        one thread, then the command loop (the kit's `Stepped`: a rollout of a chosen shape).
    commands
        the command loop alone (the gate's unit tests, the hot-path bench, bench/driver.py).

HOME is $CODEX_HOME, HOOK_CLIENT the hook-client to run, EXTRA_ENV a JSON object of variables
added to the hooks' environment (from which the tool-command markers are removed, as from
Codex's own). A thread started by a mode prints `{"ready": true, "pid", "rollout"}` first.

The command loop reads one JSON command per stdin line and answers one JSON line each;
a failure or an unknown op answers `{"error": ...}`. Its ops, by who needs them:
    threads (kit):    new_thread {thread} -> {rollout}; rec {kind, payload, thread?} -> {size};
                      filler {count, bytes, thread?} -> {size}; hook {event, turn?, extra?,
                      thread?, env?, stderr?} -> the call's record; hook_start (same) -> {spawned};
                      hook_wait {id} -> the call's record; hook_kill
    fds (gate):       open_rollout {path, append?, inheritable?}, lock {path, inheritable?},
                      set_inheritable {what, value}, close {what} (what: rollouts | locks),
                      append {data} (to the last rollout opened), spawn {argv, env?, unset?} ->
                      {pid}, wait {pid}
    timing (bench):   hold {thread, path, lock, turn}, run, rss, load, fds {n}, pid: each hook
                      child is timed HERE, perf_counter_ns before posix_spawn to after wait4,
                      and /bin/true is spawned the same way by the same process.
"""
import fcntl
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid

TOOL_COMMAND_MARKERS = ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"]
HOOK = [{"provenance": {"type": "harness", "hook": True}}]  # what Codex puts on hook output


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace("'", "&apos;")


def marker_ids(text):
    ids, key = [], '<courier-message id="'
    at = text.find(key)
    while at >= 0:
        end = text.find('"', at + len(key))
        ids.append(text[at + len(key):end])
        at = text.find(key, end)
    return ids


class Thread:
    """One thread this codex holds: its rollout (O_APPEND) and its writer lock."""

    def __init__(self, thread, path, fd, lock, turn=None):
        self.thread, self.path, self.fd, self.lock, self.turn = thread, path, fd, lock, turn
        self.ordinal = 0

    @classmethod
    def create(cls, home, thread):
        """A new thread, as Codex starts one: the lock taken, the rollout made, `session_meta`."""
        d = os.path.join(home, "sessions/2026/11/29")
        os.makedirs(d, exist_ok=True)
        os.makedirs(os.path.join(home, "thread-writer-locks"), exist_ok=True)
        path = os.path.join(d, "rollout-2026-11-29T08-08-52-%s.jsonl" % thread)
        lock = os.open(os.path.join(home, "thread-writer-locks", thread + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        t = cls(thread, path, fd, lock)
        t.rec("session_meta", {"id": thread, "session_id": thread, "cwd": "/", "originator": "standin", "cli_version": "0.171.0"})
        return t

    @classmethod
    def hold(cls, thread, path, lock, turn):
        """A thread whose rollout exists (the bench writes it): opened for append, lock taken."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        lk = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(thread, path, fd, lk, turn)

    def rec(self, kind, payload):
        self.ordinal += 1
        line = {"timestamp": "2026-11-29T08:08:52.339Z", "ordinal": self.ordinal, "type": kind, "payload": payload}
        os.write(self.fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def size(self):
        return os.fstat(self.fd).st_size

    # The records Codex writes around each hook (docs/security.md, "One ticket per Codex
    # action"), so each hook follows its own Codex action (gate/ticket.rs): the tool call before
    # PreToolUse, its item_completed before PostToolUse and its output after, the answer before Stop.
    def tool_call(self, call, turn):
        self.rec("response_item", {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": call,
                                   "internal_chat_message_metadata_passthrough": {"turn_id": turn}})

    def tool_completed(self, call, turn):
        self.rec("event_msg", {"type": "item_completed", "thread_id": self.thread, "turn_id": turn,
                               "item": {"type": "CommandExecution", "id": call}})

    def tool_output(self, call):
        self.rec("response_item", {"type": "function_call_output", "call_id": call, "output": "ok"})

    def show(self, event, turn, out):
        """What Codex appends for a hook's output; returns the text that reached the model."""
        o = json.loads(out)
        if event == "Stop":
            if o.get("decision") != "block":
                return None
            text = o["reason"]
            self.rec("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text",
                     "text": '<hook_prompt hook_run_id="stop:1">' + xml_escape(text) + "</hook_prompt>"}],
                     "internal_chat_message_metadata_passthrough": {"turn_id": turn, "content_item_metadata": HOOK}})
            return text
        text = o["hookSpecificOutput"]["additionalContext"]
        self.rec("response_item", {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}],
                 "internal_chat_message_metadata_passthrough": {"turn_id": turn, "content_item_kinds": ["hooks.additional_context"],
                                                                "content_item_metadata": HOOK}})
        return text


class Codex:
    """This process as Codex: its threads, its hook-client and its hooks' environment."""

    def __init__(self, hook_client=None, extra_env=None):
        self.hook_client = hook_client
        self.env = dict(os.environ)
        for k in TOOL_COMMAND_MARKERS:
            self.env.pop(k, None)
        self.env.update(extra_env or {})
        self.threads = {}     # thread id -> Thread
        self.first = None     # the thread a command without `thread` means
        self.hooks = {}       # id -> (Popen, Thread, event, turn, start) of hooks started
        self.fds = {}         # gate ops: "rollouts" | "locks" -> [fd]
        self.procs = {}       # gate ops: pid -> Popen
        self.held_fds = []    # bench op "fds"
        self.log_fd = None    # bench: where hook children's stderr goes

    def add(self, t):
        self.threads[t.thread] = t
        self.first = self.first or t
        return t

    def thread(self, c):
        return self.threads[c["thread"]] if c.get("thread") else self.first

    def start_hook(self, t, event, turn, extra, env=None, stderr=None):
        """Runs hook-client for `event` as Codex does: own session, payload on stdin."""
        p = {"session_id": t.thread, "transcript_path": t.path, "cwd": "/", "hook_event_name": event,
             "model": "m", "permission_mode": "bypassPermissions"}
        if turn is not None:
            p["turn_id"] = turn
        p.update(extra)
        e = dict(self.env)
        e.update(env or {})
        r, w = os.pipe()
        os.write(w, json.dumps(p).encode())  # far below a pipe's buffer: never blocks
        os.close(w)
        err = open(stderr, "w") if stderr else subprocess.PIPE
        start = (time.monotonic(), time.time())
        c = subprocess.Popen([self.hook_client], stdin=r, stdout=subprocess.PIPE, stderr=err, env=e, start_new_session=True)
        os.close(r)
        if stderr:
            err.close()
        return (c, t, event, turn, start)

    def finish_hook(self, started):
        """Waits for a hook (30 s, then kills it), shows its output; returns the call's record."""
        c, t, event, turn, (t0, wall) = started
        try:
            out, err = c.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            c.kill()
            out, err = c.communicate()
        ms = (time.monotonic() - t0) * 1000.0
        text = t.show(event, turn, out) if c.returncode == 0 and out.strip() else None
        return {"event": event, "turn": turn, "rc": c.returncode, "ms": ms, "t": wall, "shown": text,
                "out": out.decode(errors="replace"), "err": (err or b"").decode(errors="replace")[-300:]}

    def hook(self, t, event, turn, extra):
        return self.finish_hook(self.start_hook(t, event, turn, extra))


def start_thread(args):
    """The argv of `turns` and `stepped`: HOME THREAD HOOK_CLIENT EXTRA_ENV, then the mode's own."""
    home, thread, hc, extra = args[:4]
    codex = Codex(hc, json.loads(extra))
    t = codex.add(Thread.create(home, thread))
    say({"ready": True, "pid": os.getpid(), "rollout": t.path})
    return codex, t, args[4:]


def turns(args):
    """Turn after turn of tool calls and their hooks, every call printed, until the stop file."""
    codex, t, (stop_file, tools_per_turn) = start_thread(args)
    tools_per_turn = int(tools_per_turn)

    def run_hook(event, turn, extra):
        r = codex.hook(t, event, turn, extra)
        say(r)
        return r["shown"]

    def answer(turn):
        t.rec("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}],
              "internal_chat_message_metadata_passthrough": {"turn_id": turn}})
        t.rec("token_usage_record", {"thread_id": t.thread, "turn_id": turn, "usage": {}})

    n = 0
    while not os.path.exists(stop_file):
        turn = str(uuid.uuid4())
        t.rec("event_msg", {"type": "task_started", "turn_id": turn})
        t.rec("turn_context", {"turn_id": turn})
        for i in range(tools_per_turn):
            call = "call_%d" % n
            t.tool_call(call, turn)
            t.rec("token_usage_record", {"thread_id": t.thread, "turn_id": turn, "usage": {}})
            extra = {"tool_name": "Bash", "tool_input": {"command": "true"}, "tool_use_id": call}
            if i % 2 == 0:
                run_hook("PreToolUse", turn, extra)
            t.tool_completed(call, turn)
            if i % 2 == 1:
                run_hook("PostToolUse", turn, extra)
            t.tool_output(call)
            n += 1
        active = False
        for _ in range(5):
            answer(turn)
            if run_hook("Stop", turn, {"stop_hook_active": active, "last_assistant_message": "done"}) is None:
                break
            active = True
        t.rec("event_msg", {"type": "task_complete", "turn_id": turn, "last_agent_message": "done"})
    say({"stopped": True, "hooks": n})


# ---- the command loop's ops: each takes (codex, command) and returns the answer ----

def op_new_thread(codex, c):
    return {"ok": True, "rollout": codex.add(Thread.create(c["home"], c["thread"])).path}


def op_rec(codex, c):
    t = codex.thread(c)
    t.rec(c["kind"], c["payload"])
    return {"ok": True, "size": t.size()}


def op_filler(codex, c):
    # `count` records of `bytes` each, as a long tool output: function_call_output lines.
    t = codex.thread(c)
    for i in range(c["count"]):
        t.rec("response_item", {"type": "function_call_output", "call_id": "filler_%d" % i, "output": "y" * c["bytes"]})
    return {"ok": True, "size": t.size()}


def start_hook_of(codex, c):
    return codex.start_hook(codex.thread(c), c["event"], c.get("turn"), c.get("extra", {}), c.get("env"), c.get("stderr"))


def op_hook(codex, c):
    return codex.finish_hook(start_hook_of(codex, c))


def op_hook_start(codex, c):
    hid = len(codex.hooks)
    codex.hooks[hid] = start_hook_of(codex, c)
    return {"ok": True, "spawned": hid}


def op_hook_wait(codex, c):
    return codex.finish_hook(codex.hooks.pop(c["id"]))


def op_hook_kill(codex, c):
    for p, *_ in codex.hooks.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    codex.hooks.clear()
    return {"ok": True}


def op_open_rollout(codex, c):
    flags = (os.O_WRONLY | os.O_APPEND) if c.get("append", True) else os.O_RDONLY
    fd = os.open(c["path"], flags)
    # Python opens fds O_CLOEXEC; "inheritable" clears it, as on an fd inherited across exec.
    os.set_inheritable(fd, c.get("inheritable", False))
    codex.fds.setdefault("rollouts", []).append(fd)
    return {"ok": True}


def op_lock(codex, c):
    fd = os.open(c["path"], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.set_inheritable(fd, c.get("inheritable", False))
    codex.fds.setdefault("locks", []).append(fd)
    return {"ok": True}


def op_set_inheritable(codex, c):
    for fd in codex.fds.get(c["what"], []):
        os.set_inheritable(fd, c["value"])
    return {"ok": True}


def op_close(codex, c):
    for fd in codex.fds.pop(c["what"], []):
        os.close(fd)
    return {"ok": True}


def op_append(codex, c):
    os.write(codex.fds["rollouts"][-1], c["data"].encode())
    return {"ok": True}


def op_spawn(codex, c):
    env = dict(os.environ)
    env.update(c.get("env", {}))
    for k in c.get("unset", []):
        env.pop(k, None)
    p = subprocess.Popen(c["argv"], env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    codex.procs[p.pid] = p
    return {"pid": p.pid}


def op_wait(codex, c):
    codex.procs[c["pid"]].wait()
    return {"ok": True}


# ---- the bench's timed hooks ----

def spawn_timed(codex, argv, stdin_bytes):
    """Runs argv with stdin_bytes on a pipe; returns (ns, exit status, stdout bytes, maxrss KiB)."""
    if codex.log_fd is None:
        codex.log_fd = os.open(os.environ.get("COURIER_BENCH_CHILD_LOG", "/dev/null"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.write(w_in, stdin_bytes)   # payloads are far below the pipe buffer: never blocks
    os.close(w_in)
    actions = [
        (os.POSIX_SPAWN_DUP2, r_in, 0),
        (os.POSIX_SPAWN_DUP2, w_out, 1),
        (os.POSIX_SPAWN_DUP2, codex.log_fd, 2),
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


CALL_IDS = itertools.count(1)


def payload_for(codex, template, thread):
    """The payload of the next hook of `thread`. Like Codex, a PostToolUse follows its own tool
    call: the call and its item_completed are written first, its output after the hook
    (`answered`)."""
    p = dict(template)
    t = codex.threads[thread]
    p["session_id"] = thread
    p["turn_id"] = t.turn
    p["transcript_path"] = t.path
    if p.get("hook_event_name") == "PostToolUse":
        call = "call_bench_%d" % next(CALL_IDS)
        p["tool_use_id"] = call
        t.tool_call(call, t.turn)
        t.tool_completed(call, t.turn)
    return json.dumps(p).encode(), p.get("tool_use_id")


def answered(codex, thread, call):
    """After the hook: Codex writes the tool call's output."""
    if call:
        codex.threads[thread].tool_output(call)


def delivered_ids(codex, thread, out):
    """Like Codex, a hook's output goes into the rollout; the message ids it carried."""
    if not out:
        return []
    t = codex.threads[thread]
    text = t.show("PostToolUse", t.turn, out)
    return marker_ids(text) if text else []


def op_hold(codex, c):
    # Open the rollout for append and take the thread's writer lock, as Codex does.
    codex.add(Thread.hold(c["thread"], c["path"], c["lock"], c["turn"]))
    return {"ok": True, "pid": os.getpid()}


def op_run(codex, c):
    # One timed spawn per entry of `seq` ({"argv": [...], "thread": id or null}).
    res = []
    for s in c["seq"]:
        if s.get("gap_ms"):
            time.sleep(s["gap_ms"] / 1000)  # hooks come seconds apart in a real session
        data, call = payload_for(codex, c["template"], s["thread"]) if s.get("thread") else (b"{}", None)
        ns, code, out, rss = spawn_timed(codex, s["argv"], data)
        answered(codex, s.get("thread"), call)
        ids = delivered_ids(codex, s["thread"], out) if s.get("thread") and c.get("deliver") else []
        res.append({"ns": ns, "code": code, "out_len": len(out), "rss_kib": rss, "ids": ids})
    return {"ok": True, "res": res}


def op_rss(codex, c):
    # Peak RSS via GNU time (it forks, so the child's high-water mark does not start from this
    # Python process's, as posix_spawn's vfork would make it).
    data, call = payload_for(codex, c["template"], c["thread"]) if c.get("thread") else (b"{}", None)
    r = subprocess.run(["/usr/bin/time", "-f", "%M", *c["argv"]], input=data, capture_output=True)
    answered(codex, c.get("thread"), call)
    return {"ok": True, "kib": int(r.stderr.decode().strip().splitlines()[-1]), "code": r.returncode}


def op_load(codex, c):
    """`workers` concurrent hook clients for `seconds`, round-robin over the held threads."""
    order = list(codex.threads)
    state = {"next": 0, "lat": [], "errors": [], "ids": [], "calls": 0}
    mu = threading.Lock()
    stop_at = time.monotonic() + c["seconds"]

    def worker():
        while time.monotonic() < stop_at:
            with mu:
                thread = order[state["next"] % len(order)]
                state["next"] += 1
            data, call = payload_for(codex, c["template"], thread)
            ns, code, out, _ = spawn_timed(codex, c["argv"], data)
            answered(codex, thread, call)
            ids = []
            try:
                ids = delivered_ids(codex, thread, out)
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
    return {"ok": True, **state}


def op_fds(codex, c):
    # Hold `n` more open files, as a long session's codex does (sockets, pipes, rollouts).
    codex.held_fds.extend(os.open("/dev/null", os.O_RDONLY) for _ in range(c["n"]))
    return {"ok": True, "open": len(os.listdir("/proc/self/fd"))}


def op_pid(codex, c):
    return {"ok": True, "pid": os.getpid()}


OPS = {name[3:]: f for name, f in globals().items() if name.startswith("op_")}


def command_loop(codex):
    for line in sys.stdin:
        c = json.loads(line)
        op = OPS.get(c.get("op"))
        try:
            say(op(codex, c) if op else {"error": "unknown op %s" % c.get("op")})
        except Exception as e:  # noqa: BLE001 - the caller shows it
            say({"error": repr(e)})


def main(argv):
    mode, args = argv[0], argv[1:]
    if mode == "turns":
        turns(args)
    elif mode == "stepped":
        codex, _, _ = start_thread(args)
        command_loop(codex)
    elif mode == "commands":
        command_loop(Codex())
    else:
        sys.exit("codex_standin.py: unknown mode %r (turns | stepped | commands)" % mode)


main(sys.argv[1:])
