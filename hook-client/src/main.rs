//! `hook-client`: the command Codex runs for each hook event. It forwards the payload on stdin to
//! the Courier broker and prints what the broker answers, so a queued message reaches the model.
//!
//! Run with any argument, or with a terminal on stdin, it is a person's call, not a hook's: it
//! prints its usage (or version) and exits without contacting the broker.
//!
//! It must never hurt the Codex session: whatever goes wrong (no broker, a slow or refusing broker,
//! a bad payload) it prints nothing and exits 0 within its deadline. The one exception keeps
//! delivery exactly-once: once it has printed a leased message it exits 0 only if the broker
//! accepted its ack, because Codex ignores the stdout of a hook that exits non-zero.
//!
//! Start-up cost is most of a hook call (bench/README.md), so `main` is the C entry point:
//! std's runtime set-up (stack-guard discovery via `/proc/self/maps`, sigaltstack, fd 0-2 poll)
//! is skipped; only SIGPIPE is ignored, as std would. std itself works without that set-up.
#![no_main]

use courier_shared::{auth, paths, wire};
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const DEFAULT_DEADLINE_MS: u64 = 500;
/// `--claude-wake`'s deadline until the broker says it holds the wake: the hook runs in the
/// background of the TUI (no one waits on it), and `claude -p` pays it only when the broker is
/// silent; the broker proves a wake with more steps than a hook call.
const WAKE_DEADLINE_MS: u64 = 2_000;
/// The longest hold a broker may ask for (its `[approvals] hold_secs` is at most 300).
const MAX_HOLD_MS: u64 = 300_000;
/// Past the broker's hold, for its reply to arrive.
const HOLD_MARGIN: Duration = Duration::from_secs(2);

const SUCCESS: i32 = 0;
const FAILURE: i32 = 1;
/// `--claude-wake`'s exit with a message on stderr: an `asyncRewake` hook exiting 2 wakes the
/// idle Claude Code session with its stderr (probed on 2.1.332).
const WAKE: i32 = 2;
/// The longest a wake may be held: Claude Code kills the hook at its `timeout` (600 s as
/// `broker install` registers it) anyway.
const MAX_WAKE_HOLD_MS: u64 = 600_000;

const USAGE: &str = "\
hook-client: the command Codex runs for Courier's hooks. Codex starts it with one hook payload on
stdin; it forwards the payload to the Courier broker and prints what the broker answers (a queued
message for that thread, or nothing). It is not meant to be run by hand: queue messages with
`broker send`, check the installation with `broker doctor`.

usage: hook-client [--context-limit N] < PAYLOAD
                                 as Codex runs it (N: its handler's additionalContextLimit):
                                 silent, and exits 0 whatever goes wrong
       hook-client --host copilot --event EVENT < PAYLOAD
                                 as GitHub Copilot CLI runs it (its payload does not name
                                 the event): silent, and exits 0 whatever goes wrong
       hook-client --claude-wake < STOP-PAYLOAD
                                 as Claude Code runs its Stop hook (asyncRewake): waits for a
                                 message for the idle session, prints it on stderr and exits 2;
                                 else exits 0 with no output
       hook-client --version
       hook-client --help

environment: COURIER_HOOK_DEADLINE_MS (deadline, default 500; 2000 for --claude-wake until held), COURIER_DEBUG=1 (say on stderr why
nothing was delivered), COURIER_RUNTIME_DIR (where the broker's socket is)";

/// Exit status for a command line that is not a hook call. Never 2: Codex reads exit 2 from a
/// hook as "block", with stderr as the reason.
const USAGE_ERROR: i32 = 64;

/// What the command line asks for.
enum Call {
    /// A hook call, with the handler's context limit if the command names one, and the host and
    /// event for a host whose payload does not name its event.
    Hook { context_limit: Option<u64>, host_event: Option<wire::HostEvent> },
    /// Claude Code's idle-wake Stop hook (`--claude-wake`).
    ClaudeWake,
    /// A person's call, answered: exit with this status.
    Answered(i32),
}

/// `--context-limit N` alone is how `broker install` runs it; other arguments, or a terminal on
/// stdin, mean a person is running it: answer them, and never contact the broker (which would
/// record the call as a refused hook).
fn parse_call(argc: libc::c_int, argv: *const *const libc::c_char) -> Call {
    // SAFETY: argv holds argc valid C strings (the C runtime's contract for main).
    let arg = |i: usize| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
    if argc == 2 && arg(1) == courier_shared::wire::CLAUDE_WAKE_FLAG {
        return match operator_call(1, argv) {
            Some(code) => Call::Answered(code),
            None => Call::ClaudeWake,
        };
    }
    if argc == 3 && arg(1) == courier_shared::wire::CONTEXT_LIMIT_FLAG {
        if let Ok(n) = arg(2).parse::<u64>() {
            return match operator_call(1, argv) {
                Some(code) => Call::Answered(code),
                None => Call::Hook { context_limit: Some(n), host_event: None },
            };
        }
    }
    if argc == 5 && arg(1) == wire::HOST_FLAG && arg(3) == wire::EVENT_FLAG {
        let host_event = wire::HostEvent { host: arg(2).into_owned(), event: arg(4).into_owned() };
        return match operator_call(1, argv) {
            Some(code) => Call::Answered(code),
            None => Call::Hook { context_limit: None, host_event: Some(host_event) },
        };
    }
    match operator_call(argc, argv) {
        Some(code) => Call::Answered(code),
        None => Call::Hook { context_limit: None, host_event: None },
    }
}

/// Arguments, or a terminal on stdin, mean a person is running it: answer them.
fn operator_call(argc: libc::c_int, argv: *const *const libc::c_char) -> Option<i32> {
    if argc <= 1 {
        // SAFETY: isatty on fd 0 only queries it.
        let tty = unsafe { libc::isatty(0) } == 1;
        if !tty {
            return None; // a hook call
        }
        eprintln!("{USAGE}\n\nhook-client: stdin is a terminal, not a hook payload; nothing sent");
        return Some(USAGE_ERROR);
    }
    // SAFETY: argv holds argc valid C strings (the C runtime's contract for main).
    let first = unsafe { std::ffi::CStr::from_ptr(*argv.add(1)) }.to_string_lossy();
    match &*first {
        "--version" | "-V" => {
            println!("hook-client {}", env!("CARGO_PKG_VERSION"));
            Some(SUCCESS)
        }
        "--help" | "-h" => {
            eprintln!("{USAGE}");
            Some(SUCCESS)
        }
        other => {
            eprintln!("{USAGE}\n\nhook-client: unexpected argument {other:?}; nothing sent");
            Some(USAGE_ERROR)
        }
    }
}

#[no_mangle]
pub extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: setting a signal disposition before any other thread exists. A closed pipe must be
    // an EPIPE error (handled below), not a kill.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let call = parse_call(argc, argv);
    let ran = match call {
        Call::Answered(code) => return code,
        Call::Hook { context_limit, host_event } => run(Instant::now() + deadline_from_env(DEFAULT_DEADLINE_MS), context_limit, host_event),
        Call::ClaudeWake => run_claude_wake(Instant::now() + deadline_from_env(WAKE_DEADLINE_MS)),
    };
    match ran {
        Ok(code) => code,
        Err(err) => {
            if std::env::var_os("COURIER_DEBUG").is_some() {
                eprintln!("courier hook-client: {err} (fail-open, nothing delivered)");
            }
            SUCCESS
        }
    }
}

fn deadline_from_env(default_ms: u64) -> Duration {
    let ms = std::env::var("COURIER_HOOK_DEADLINE_MS").ok().and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(default_ms).clamp(10, 30_000))
}

/// The hook payload on stdin, bounded by [`wire::MAX_PAYLOAD`].
fn read_payload() -> io::Result<String> {
    let mut payload = Vec::with_capacity(4096);
    io::stdin().lock().take(wire::MAX_PAYLOAD as u64 + 1).read_to_end(&mut payload)?;
    if payload.len() > wire::MAX_PAYLOAD {
        return Err(io::Error::other("payload over the size limit, not forwarded"));
    }
    String::from_utf8(payload).map_err(|_| io::Error::other("payload is not UTF-8"))
}

fn run(deadline: Instant, context_limit: Option<u64>, host_event: Option<wire::HostEvent>) -> io::Result<i32> {
    let payload = read_payload()?;
    let runtime_dir = paths::runtime_dir();
    let socket_path = paths::socket_path(&runtime_dir);
    check_owned_by_me(&socket_path)?;
    let secret = auth::load_secret(&paths::secret_path(&runtime_dir))?;

    // The request is ready before connecting, so it follows the connect at once: the broker can
    // take it when it accepts, without waiting for it.
    let pid = std::process::id();
    let ts_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mac = auth::sign(&secret, pid, ts_ms, payload.as_bytes());
    let request = wire::Request::Hook { v: wire::PROTOCOL_VERSION, pid, ts_ms, payload, mac, context_limit, host_event };
    let body = serde_json::to_vec(&request).map_err(io::Error::other)?;
    let mut stream = connect_nonblocking(&socket_path, deadline)?;
    set_timeouts(&stream, deadline)?;
    wire::write_frame(&mut stream, &body)?;
    let mut reply: wire::HookReply = wire::read_json(&mut stream, wire::MAX_FRAME)?;
    if let Some(ms) = reply.hold_ms {
        // Held for a person's answer: the broker bounded the wait, and said so at once (a
        // broker that says nothing still fails open at the usual deadline).
        let held = Instant::now() + Duration::from_millis(ms.min(MAX_HOLD_MS)) + HOLD_MARGIN;
        set_timeouts(&stream, held)?;
        reply = wire::read_json(&mut stream, wire::MAX_FRAME)?;
    }
    if reply.output.is_empty() {
        return Ok(SUCCESS);
    }

    let mut stdout = io::stdout().lock();
    stdout.write_all(reply.output.as_bytes())?;
    stdout.flush()?;
    let Some(lease) = reply.lease else { return Ok(SUCCESS) };
    test_stall("before_ack");
    // From here on an error must not exit 0: the printed output would reach the model without
    // the broker knowing it was handed, and the message would be offered again.
    let acked = set_timeouts(&stream, deadline)
        .and_then(|()| wire::write_json(&mut stream, &wire::Request::Ack { v: wire::PROTOCOL_VERSION, lease }))
        .and_then(|()| wire::read_json::<_, wire::AckReply>(&mut stream, wire::MAX_FRAME));
    match acked {
        Ok(ack) if ack.accepted => {
            test_stall("after_ack");
            Ok(SUCCESS)
        }
        _ => {
            eprintln!("courier hook-client: lease {lease} not acknowledged; output withdrawn");
            Ok(FAILURE)
        }
    }
}

/// `--claude-wake`: Claude Code's `Stop` hook with `asyncRewake`. Sends the Stop payload to the
/// broker's wake socket, then (asked) this process's stdout and stderr (`SCM_RIGHTS`): the broker proves
/// from them that claude itself started this hook. Held while the broker waits for a message for
/// the idle session; the message (already recorded as handed) goes to stderr with exit 2, which
/// Claude Code turns into a new turn. Anything else: exit 0, nothing printed, within the deadline
/// or the hold the broker announced.
///
/// A broker that goes away while it holds the wake (`broker restart`, a crash) closes the
/// connection without an answer: the wake is presented again to the broker that starts next,
/// for what is left of the hold, so an idle session stays reachable across a restart.
fn run_claude_wake(deadline: Instant) -> io::Result<i32> {
    let payload = read_payload()?;
    let started = Instant::now();
    let socket_path = paths::claude_wake_socket_path(&paths::runtime_dir());
    // `claude -p` waits for a Stop hook however it is marked (probed on 2.1.332): held only in the
    // interactive TUI, which Claude Code tells its hooks.
    let hold = std::env::var_os("CLAUDE_CODE_ENTRYPOINT").is_some_and(|v| v == "cli");
    let mut request = wire::WakeRequest { v: wire::PROTOCOL_VERSION, hold, payload, hold_left_ms: None };
    // Once a broker that held the wake went away: until when to look for the next one.
    let mut rearm_until: Option<Instant> = None;
    loop {
        check_owned_by_me(&socket_path).or_else(|e| none_listening(e, rearm_until))?;
        let attempt_deadline = rearm_until.map_or(deadline, |_| Instant::now() + Duration::from_millis(WAKE_DEADLINE_MS));
        match present_wake(&socket_path, &request, attempt_deadline) {
            Ok(Woken::Text(text)) => {
                io::stderr().lock().write_all(text.as_bytes())?;
                return Ok(WAKE);
            }
            Ok(Woken::Nothing) => return Ok(SUCCESS),
            Ok(Woken::BrokerGone) if hold => {
                // Within the hook's own life: Claude Code kills it at its timeout anyway.
                let left = Duration::from_millis(MAX_WAKE_HOLD_MS).saturating_sub(started.elapsed() + REARM_MARGIN);
                if left.is_zero() {
                    return Ok(SUCCESS);
                }
                request.hold_left_ms = Some(left.as_millis() as u64);
                rearm_until = Some(Instant::now() + left.min(REARM_WAIT));
            }
            Ok(Woken::BrokerGone) => return Ok(SUCCESS),
            Ok(Woken::NotTaken) => none_listening(io::ErrorKind::ConnectionRefused.into(), rearm_until)?,
            Err(e) => none_listening(e, rearm_until)?,
        }
    }
}

/// While re-arming (until `rearm_until`), a socket no broker listens on yet (gone, refused) is
/// looked at again after [`REARM_LOOK`]; any other error, or one past that time, ends the wake.
fn none_listening(e: io::Error, rearm_until: Option<Instant>) -> io::Result<()> {
    let waiting = matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused);
    match rearm_until {
        Some(until) if waiting && Instant::now() + REARM_LOOK < until => {
            std::thread::sleep(REARM_LOOK);
            Ok(())
        }
        _ => Err(e),
    }
}

/// How a wake presented to one broker ended.
enum Woken {
    /// The message, recorded as handed: printed on stderr, exit 2.
    Text(String),
    /// Nothing (not proven, released, the hold ended): exit 0.
    Nothing,
    /// The broker held the wake and then closed the connection without an answer: it stopped.
    BrokerGone,
    /// The connection ended before any answer to the request: no broker took it.
    NotTaken,
}

/// Past the hook's own timeout, kept free so that a re-armed wake ends before Claude Code kills it.
const REARM_MARGIN: Duration = Duration::from_secs(30);
/// How long a wake waits for a broker to listen again after the one holding it went away.
const REARM_WAIT: Duration = Duration::from_secs(120);
/// How often it looks for that broker.
const REARM_LOOK: Duration = Duration::from_millis(100);

/// One presentation of the wake: the request, the fds when asked, then the hold.
fn present_wake(socket_path: &Path, request: &wire::WakeRequest, deadline: Instant) -> io::Result<Woken> {
    let body = serde_json::to_vec(request).map_err(io::Error::other)?;
    let mut stream = connect_nonblocking(socket_path, deadline)?;
    set_timeouts(&stream, deadline)?;
    // A broker exiting closes its listen queue after the connection it held: a connection made
    // in between is reset or ended unanswered. Nothing of it was proven or claimed then.
    let asked =
        match wire::write_frame(&mut stream, &body).and_then(|()| wire::read_json::<_, wire::WakeReply>(&mut stream, wire::MAX_FRAME)) {
            Ok(asked) => asked,
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe) => {
                return Ok(Woken::NotTaken)
            }
            Err(e) => return Err(e),
        };
    // Only a broker that read the request gets the fds: copies in flight to a silent one would
    // keep claude's end of our stdout open after we exit.
    if !asked.fds || send_with_fds(&stream, &[0], &[1, 2])? != 1 {
        return Ok(Woken::Nothing);
    }
    let mut reply: wire::WakeReply = wire::read_json(&mut stream, wire::MAX_FRAME)?;
    if let Some(ms) = reply.hold_ms {
        set_timeouts(&stream, Instant::now() + Duration::from_millis(ms.min(MAX_WAKE_HOLD_MS)) + HOLD_MARGIN)?;
        reply = match wire::read_json(&mut stream, wire::MAX_FRAME) {
            Ok(r) => r,
            // End of stream or a reset while held: the broker process went away.
            Err(e) if matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset) => return Ok(Woken::BrokerGone),
            Err(e) => return Err(e),
        };
    }
    match reply.text.is_empty() {
        true => Ok(Woken::Nothing),
        false => Ok(Woken::Text(reply.text)),
    }
}

/// Writes `data` (or its first bytes) with `fds` attached (`SCM_RIGHTS`); returns how many went.
fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[libc::c_int]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let payload_len = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic; the buffer is u64-aligned and as large as
    // CMSG_SPACE says; the iovec and msghdr point at live buffers for the call only.
    unsafe {
        let space = libc::CMSG_SPACE(payload_len as u32) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload_len as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr() as *const u8, libc::CMSG_DATA(cmsg), payload_len);
        let n = libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// Crash tests only: `COURIER_HOOK_TEST_STALL=<before_ack|after_ack>[:<file>]` parks the client at
/// that point (after a lease was printed) until it is killed; with `:<file>`, only the one call
/// that creates `<file>` stalls. Read only on the lease path.
fn test_stall(at: &str) {
    let Some(v) = std::env::var_os("COURIER_HOOK_TEST_STALL") else { return };
    let v = v.to_string_lossy();
    let (point, once) = v.split_once(':').map_or((&*v, None), |(p, f)| (p, Some(f)));
    if point != at {
        return;
    }
    if let Some(f) = once {
        if std::fs::OpenOptions::new().write(true).create_new(true).open(f).is_err() {
            return;
        }
    }
    eprintln!("courier hook-client: stalled {at}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A socket planted by another user must not receive our payload (or hand us its messages).
fn check_owned_by_me(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.uid() != paths::uid() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "broker socket owned by another user"));
    }
    Ok(())
}

/// Connects without ever blocking past the deadline: a stopped broker with a full backlog must
/// not stall the hook.
fn connect_nonblocking(path: &Path, deadline: Instant) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: plain socket syscalls on a zeroed sockaddr_un we fill within bounds.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
        }
        for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        use std::os::fd::AsRawFd;
        // EAGAIN: the listen backlog is full (a burst of connections, or a stopped broker). Try
        // again with a short backoff until the deadline rather than give up on the first burst.
        let mut pause = Duration::from_millis(1);
        while libc::connect(fd.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EAGAIN) || Instant::now() + pause >= deadline {
                return Err(err);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(8));
        }
        let stream = UnixStream::from(fd);
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

fn set_timeouts(stream: &UnixStream, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}
