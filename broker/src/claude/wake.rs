//! Reaching an idle Claude Code session: Claude Code's `Stop` command hook marked `asyncRewake`
//! (`hook-client --claude-wake`, registered by `broker install`) may run long; when it exits 2,
//! the idle session starts a new turn whose model sees the hook's stderr (probed on 2.1.332,
//! docs/claude-code.md "Idle wake"). The broker holds that hook's connection until a message is
//! pending for the session, records the hand-off (fsynced) and only then answers it.
//!
//! A command hook can be imitated by a model's command, so the proof is what only claude can
//! give: hook-client passes its stdout and stderr (`SCM_RIGHTS`, once the broker has read its
//! request and asks), and the socket's peer credentials name the process that created the pair. Steps, in order (any failure closes the
//! connection unanswered and is recorded):
//! - `payload`: a Stop payload (`claude/gate.rs`);
//! - `wake_fds`: stdout and stderr are two distinct sockets one live process created (claude
//!   spawns every hook with its own pairs; a model's command has `/dev/null` and a file), and the
//!   hook-client that connected descends from that process;
//! - `trusted_claude`, `clean_start`, `transcript`: the HTTP gate's steps on that process;
//! - `session_owner`: the session is pinned to it and its open turn is the payload's;
//! - `turn_ticket`: one wake per (session, `prompt_id`, stdout socket): claude makes new sockets
//!   for every hook it runs, so a connection presenting a hook's sockets again is `ticket_used`
//!   (`claude -p` fires Stop again with the same `prompt_id` after a wake's message: a new hook).
//!
//! Held, it delivers only while the session stays idle: after the proven HTTP `Stop` of that
//! turn (the [`Stops`] mark; a model's command running mid-turn never sees it) and before another
//! turn opens (the pin's `prompt_id` moves at the next UserPromptSubmit: then the held wake
//! answers nothing and the HTTP hooks deliver). `claude -p` waits for the hook (it runs as an
//! ordinary blocking Stop hook there), so a `-p` wake is never held: once its turn's Stop is seen,
//! what is pending goes at once, else nothing.

use super::gate::{self, Proven};
use super::gate_trust::StoreTrust;
use super::peer::Holder;
use super::refusals::Refusals;
use crate::exe::digest::DigestCache;
use crate::os::ProcessKey;
use crate::refusal::Refusal;
use crate::refusal::RefusalCode;
use crate::store::{Channel, HandOff, Message, Store, Ticket, TicketClaim};
use anyhow::Result;
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use courier_shared::wire::{self, WakeReply, WakeRequest};
use nix::libc;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a wake is held at most: below the hook's `timeout` (`settings::WAKE_TIMEOUT_SECS`),
/// so the broker answers before Claude Code kills the hook.
pub const HOLD: Duration = Duration::from_secs(540);
/// A `claude -p` wake (never held) waits at most this long for its turn's HTTP Stop; once that
/// is seen it answers at once, a message or nothing.
const UNHELD: Duration = Duration::from_secs(5);
/// Proven wakes held at once, one per session (a newer proven wake of a session releases the
/// older); a proven wake finding them all taken answers nothing (the hook exits 0).
pub const MAX_HELD: usize = 32;
/// Connections still sending their request at once. A newcomer finding them all taken closes
/// the oldest: a genuine hook-client sends its request and fds as soon as it connects, so a peer
/// that is slow cannot keep a slot from it.
pub const MAX_PROVING: usize = 32;
/// How long a connection has, from its accept, to send its request and its fds (the whole
/// exchange, not each read: a peer trickling a byte at a time is cut at this).
const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How often a wake looks for its turn's Stop.
const TICK: Duration = Duration::from_millis(200);
/// How often a held wake of an idle session with nothing queued looks again anyway: a message
/// queued wakes it at once ([`crate::store::QUEUED`]), but its claude exiting, another turn
/// opening or the hook going are signalled by nothing.
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// Most bytes a wake hands: its stderr reached the model whole at 40,000 characters (probed on
/// 2.1.332), unlike hook context (10,000).
pub const MAX_WAKE_BYTES: usize = 32_000;
/// A lease lives this long before its hand-off is recorded (the same step records it).
const LEASE_MS: i64 = 10_000;

/// The turns whose proven HTTP `Stop` the endpoint saw, by session: a wake delivers only after
/// its turn stopped.
#[derive(Clone, Default)]
pub struct Stops(Arc<Mutex<HashMap<ThreadId, String>>>);

impl Stops {
    /// The session's turn `prompt_id` stopped (a proven main-conversation HTTP Stop).
    pub fn note(&self, session: &ThreadId, prompt_id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(session.clone(), prompt_id.to_string());
    }

    fn stopped(&self, session: &ThreadId, prompt_id: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(session).is_some_and(|p| p == prompt_id)
    }
}

struct Waker {
    /// Its own connection to the queue: pins, tickets, leases, refusals.
    store: Mutex<Store>,
    digests: DigestCache,
    /// The followed `claude` commands (the gate's expected binaries).
    followed: Arc<super::follow::Followed>,
    stops: Stops,
    /// Connections still sending their request, oldest first ([`MAX_PROVING`]).
    proving: Mutex<Proving>,
    /// The proven wakes held, by session: the newest one's number ([`MAX_HELD`]).
    held: Mutex<HashMap<ThreadId, u64>>,
    /// Connection threads alive, a backstop (closed connections' threads end at their next read).
    threads: AtomicUsize,
    refusals: Refusals,
    /// When this broker started (ms): a wake ticket taken before it, which was handed nothing, is
    /// the same hook presenting its wake again after the broker holding it went away.
    started_ms: i64,
}

/// The connections still sending their request, oldest first, and the next connection's number.
#[derive(Default)]
struct Proving {
    next: u64,
    conns: std::collections::VecDeque<(u64, UnixStream)>,
}

/// Serves `listener` (the wake socket `server/` bound) on its own threads.
pub fn spawn(
    listener: UnixListener,
    state_dir: &Path,
    digests: DigestCache,
    followed: Arc<super::follow::Followed>,
    stops: Stops,
) -> Result<()> {
    let mut store = Store::open(state_dir)?;
    store.forget_claude_wakes()?;
    let waker = Arc::new(Waker {
        store: Mutex::new(store),
        digests,
        followed,
        stops,
        proving: Mutex::default(),
        held: Mutex::default(),
        threads: AtomicUsize::new(0),
        refusals: Refusals::default(),
        started_ms: crate::store::now_ms(),
    });
    std::thread::Builder::new().name("claude-wake".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if waker.threads.fetch_add(1, Ordering::AcqRel) >= MAX_THREADS {
                waker.threads.fetch_sub(1, Ordering::AcqRel);
                crate::log_debug!("claude wake: {MAX_THREADS} connection threads alive, one closed unread");
                continue;
            }
            let Some(number) = waker.admit(&conn) else {
                waker.threads.fetch_sub(1, Ordering::AcqRel);
                continue;
            };
            let w = Arc::clone(&waker);
            let spawned = std::thread::Builder::new().name("claude-wake-conn".into()).spawn(move || {
                w.handle(conn, number);
                w.threads.fetch_sub(1, Ordering::AcqRel);
            });
            if spawned.is_err() {
                waker.proved(number);
                waker.threads.fetch_sub(1, Ordering::AcqRel);
            }
        }
    })?;
    Ok(())
}

/// What a held wake does next.
enum Step {
    /// The turn's HTTP Stop is not seen yet.
    Wait,
    /// The session is idle in the wake's turn, with nothing pending.
    Idle,
    /// Answer nothing: the session is no longer idle in this turn, or its claude exited.
    Release(&'static str),
    /// Recorded as handed: answer this.
    Hand(String),
}

/// How long a proven wake may be held.
#[derive(Clone, Copy)]
enum Held {
    /// `claude -p`: only until its turn's Stop is seen.
    Unheld,
    /// The TUI: this long at most ([`HOLD`], or less for a wake presented again: what is left of
    /// its hook's life).
    For(Duration),
}

impl Held {
    fn of(r: &WakeRequest) -> Held {
        match (r.hold, r.hold_left_ms) {
            (false, _) => Held::Unheld,
            (true, None) => Held::For(HOLD),
            (true, Some(left)) => Held::For(HOLD.min(Duration::from_millis(left))),
        }
    }
}

/// Connection threads alive at most: every slot, and as many again of connections closed for a
/// newcomer whose threads have not yet seen it.
const MAX_THREADS: usize = 2 * (MAX_PROVING + MAX_HELD);

impl Waker {
    /// A proving slot for a new connection: its number. When all are taken, the oldest connection
    /// still sending its request is closed (its thread sees that at its next read).
    fn admit(&self, conn: &UnixStream) -> Option<u64> {
        let handle = conn.try_clone().ok()?;
        let mut proving = self.proving.lock().unwrap_or_else(|e| e.into_inner());
        if proving.conns.len() >= MAX_PROVING {
            if let Some((_, oldest)) = proving.conns.pop_front() {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
                crate::log_debug!("claude wake: {MAX_PROVING} connections sending their request; the oldest closed for a new one");
            }
        }
        let number = proving.next;
        proving.next += 1;
        proving.conns.push_back((number, handle));
        Some(number)
    }

    /// Connection `number` is done sending its request (or gone): its proving slot is free.
    fn proved(&self, number: u64) {
        self.proving.lock().unwrap_or_else(|e| e.into_inner()).conns.retain(|(n, _)| *n != number);
    }

    fn handle(&self, mut conn: UnixStream, number: u64) {
        let same_uid = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
            .is_ok_and(|c| c.uid() == nix::unistd::getuid().as_raw());
        let read = match same_uid && conn.set_write_timeout(Some(READ_DEADLINE)).is_ok() {
            true => read_request(&mut conn, Instant::now() + READ_DEADLINE),
            false => Err(std::io::ErrorKind::PermissionDenied.into()),
        };
        self.proved(number);
        let (request, fds) = match read {
            Ok(r) => r,
            Err(e) => return crate::log_debug!("claude wake: request not read: {e}"),
        };
        let proven = match self.prove(&conn, &request, fds) {
            Ok(p) => p,
            Err(refusal) => return self.record(&refusal),
        };
        let Some(_slot) = HeldSlot::take(&self.held, &proven.payload.session_id, number) else {
            crate::log_warn!(
                "claude wake of session {}: {MAX_HELD} sessions' wakes already held; answered nothing",
                proven.payload.session_id
            );
            return;
        };
        let text = self.hold(&conn, &proven, Held::of(&request), number);
        if self.newest_of_session(&proven, number) {
            self.note_held(&proven, None);
        }
        if let Err(e) = wire::write_json(&mut conn, &WakeReply { text, ..WakeReply::default() }) {
            crate::log_warn!("claude wake: answer to session {} not written: {e}", proven.payload.session_id);
        }
    }

    /// Every step of the module doc, in order.
    fn prove(&self, conn: &UnixStream, req: &WakeRequest, fds: Vec<OwnedFd>) -> Result<Proven, Refusal> {
        let until = Instant::now() + READ_DEADLINE;
        let payload = gate::payload(super::Event::Stop.as_str(), req.payload.as_bytes())?;
        let (holder, stdout) = match wake_fds(conn, fds) {
            Ok(h) => h,
            Err(detail) => return Err(gate::refusal(RefusalCode::ClaudeWakeFd, detail, &payload)),
        };
        let proven = gate::prove_claude(holder, payload, &self.digests, &StoreTrust(&self.store, &self.followed), until)?;
        let pay = &proven.payload;
        if pay.agent_id.is_some() {
            return Err(gate::refusal(RefusalCode::ClaudeTurn, "a sub-agent's Stop wakes nothing".into(), pay));
        }
        super::session::session_owner(&self.store, &proven, until)?;
        let mut store = crate::store::lock(&self.store);
        let ticket = Ticket {
            thread: pay.session_id.clone(),
            key: format!("claude:wake:{}:{stdout}", pay.prompt_id),
            event: HookEvent::parse(super::Event::Stop.as_str()),
        };
        match store.claim_wake_ticket(&ticket, proven.key().pid, self.started_ms) {
            Ok(TicketClaim::New) => Ok(proven),
            Ok(TicketClaim::Used { at, pid, handed }) => {
                crate::log_warn!("ALARM: {} presented twice (pid {pid:?}, then pid {}); handed: {handed:?}", ticket.key, proven.key().pid);
                let detail = format!("{} was accepted at {at} from pid {pid:?}; what it was handed ({handed:?}) is marked", ticket.key);
                Err(gate::refusal(RefusalCode::TicketUsed, detail, pay))
            }
            Err(e) => Err(gate::refusal(RefusalCode::NoTicket, format!("ticket {} could not be recorded: {e:#}", ticket.key), pay)),
        }
    }

    /// Holds a proven wake until a message is handed (its text), the session leaves idleness, the
    /// client goes, or the hold ends (empty: nothing). Not `held` (`claude -p`): only until the
    /// turn's Stop is seen.
    fn hold(&self, conn: &UnixStream, p: &Proven, held: Held, number: u64) -> String {
        let (hold, held) = match held {
            Held::Unheld => (UNHELD, false),
            Held::For(d) => (d, true),
        };
        let mut writer = conn;
        let told = WakeReply { hold_ms: Some(hold.as_millis() as u64), ..WakeReply::default() };
        if let Err(e) = wire::write_json(&mut writer, &told) {
            crate::log_info!("claude wake of session {}: its client left before it was told it is held: {e}", p.payload.session_id);
            return String::new();
        }
        // Recorded before it is said: what `threads` shows of the session is true once the log is.
        if held {
            self.note_held(p, Some(crate::store::now_ms() + hold.as_millis() as i64));
        }
        crate::log_debug!("claude wake of session {} (pid {}) held for {hold:?}", p.payload.session_id, p.key().pid);
        let end = Instant::now() + hold;
        while Instant::now() < end && !closed(conn) {
            // Read before the look: a message queued after it ends the wait at once.
            let queued = crate::store::QUEUED.count();
            let looked = Instant::now();
            match self.step(p, number) {
                Ok(Step::Wait) => std::thread::sleep(TICK),
                Ok(Step::Idle) if held => {
                    crate::store::QUEUED.wait_past(queued, IDLE_LOOK.min(end.saturating_duration_since(Instant::now())));
                    // At most one look per TICK however many signals come (any process of the
                    // uid may nudge).
                    std::thread::sleep(TICK.saturating_sub(looked.elapsed()));
                }
                Ok(Step::Idle) => return String::new(),
                Ok(Step::Release(why)) => {
                    crate::log_debug!("claude wake of session {} released: {why}", p.payload.session_id);
                    return String::new();
                }
                Ok(Step::Hand(text)) => return text,
                Err(e) => {
                    crate::log_error!("claude wake of session {}: {e:#}", p.payload.session_id);
                    return String::new();
                }
            }
        }
        String::new()
    }

    /// Records on the session's pin whether a wake of it is held (and until when): what `broker
    /// threads`, `send` and `status` say of an idle session. Best effort: a failed write leaves
    /// them saying what they said before.
    fn note_held(&self, p: &Proven, until: Option<i64>) {
        if let Err(e) = crate::store::lock(&self.store).note_claude_wake(&p.payload.session_id, p.key(), until) {
            crate::log_warn!("claude wake of session {}: not recorded as held: {e:#}", p.payload.session_id);
        }
    }

    /// Whether wake `number` is still the newest held for its session.
    fn newest_of_session(&self, p: &Proven, number: u64) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(&p.payload.session_id) == Some(&number)
    }

    /// Whether the session's pin still names this wake's claude and turn.
    fn pinned(&self, p: &Proven) -> Result<bool> {
        pin_is(&crate::store::lock(&self.store), p)
    }

    /// One look: is the session still idle in the wake's turn, and is a message pending? If so it
    /// is leased and its hand-off recorded (fsynced) before anything of it leaves.
    fn step(&self, p: &Proven, number: u64) -> Result<Step> {
        let pay = &p.payload;
        if !p.claude.is_alive() {
            return Ok(Step::Release("its claude exited"));
        }
        // The pin first: a turn that opened after this wake's, and stopped again between two
        // looks, leaves `stops` naming that turn, and this wake would wait for its own turn's
        // Stop for the rest of its hold.
        if !self.pinned(p)? {
            return Ok(Step::Release("another turn opened"));
        }
        if !self.newest_of_session(p, number) {
            return Ok(Step::Release("a newer wake of the session is held"));
        }
        let mut store = crate::store::lock(&self.store);
        if !pin_is(&store, p)? {
            return Ok(Step::Release("another turn opened"));
        }
        // The Stop this broker saw, or (a wake presented again after a restart: that Stop came
        // to the broker before) the pin's record that the turn's last proven hook was its Stop.
        if !self.stops.stopped(&pay.session_id, &pay.prompt_id) && !pin_idle(&store, p)? {
            return Ok(Step::Wait);
        }
        if !store.has_pending(&pay.session_id)? {
            return Ok(Step::Idle);
        }
        let Some(lease) = store.lease(&pay.session_id, Channel::ClaudeWake, Some(&pay.prompt_id), LEASE_MS, MAX_WAKE_BYTES)? else {
            return Ok(Step::Idle);
        };
        let text = lease.messages.iter().map(Message::wrapped).collect::<Vec<_>>().join("\n");
        // Confirmation reads the transcript from here: the woken turn's request comes after.
        let offset = std::fs::metadata(&pay.transcript_path).map_or(0, |m| m.len());
        let transcript = pay.transcript_path.to_string_lossy();
        if !store.hand_off(lease.token, &HandOff::at(&transcript, offset, p.key()))? {
            return Ok(Step::Idle); // the lease lapsed: its messages are pending again
        }
        crate::failpoint::hit("claude_wake_after_hand_off");
        let ids: Vec<&str> = lease.messages.iter().map(|m| m.id.as_str()).collect();
        crate::log_info!("claude: handed {} to idle session {} (pid {}) by wake", ids.join(", "), pay.session_id, p.key().pid);
        Ok(Step::Hand(text))
    }

    fn record(&self, r: &Refusal) {
        self.refusals.record(&self.store, r, "claude wake");
    }
}

/// `wake_fds`: the passed stdout and stderr are two distinct sockets created by one live process
/// (their peer credentials: for a socket pair, its creator), and the client that connected
/// descends from it. That process is the claude to prove; with the stdout socket's inode.
fn wake_fds(conn: &UnixStream, fds: Vec<OwnedFd>) -> Result<(Holder, u64), String> {
    let [out, err]: [OwnedFd; 2] = fds.try_into().map_err(|f: Vec<OwnedFd>| format!("{} fds passed, not stdout and stderr", f.len()))?;
    let (out, err) = (socket_inode(&out).map(|i| (i, out))?, socket_inode(&err).map(|i| (i, err))?);
    if out.0 == err.0 {
        return Err(format!("stdout and stderr are one socket (socket:[{}]), not a hook's two", out.0));
    }
    let maker = |fd: OwnedFd| crate::gate::peer::identify(&UnixStream::from(fd)).map_err(|r| r.detail);
    let (made_out, made_err) = (maker(out.1)?, maker(err.1)?);
    if made_out.pid != made_err.pid {
        return Err(format!("stdout was made by pid {}, stderr by pid {}", made_out.pid, made_err.pid));
    }
    let key = ProcessKey::of(made_out.pid).map_err(|e| format!("pid {}: {e}", made_out.pid))?;
    let client = crate::gate::peer::identify(conn).map_err(|r| r.detail)?;
    descends(client.pid, key)?;
    let holder = Holder { key, pidfd: made_out.pidfd };
    match holder.is_alive() && client.is_alive() {
        true => Ok((holder, out.0)),
        false => Err(format!("pid {} or the client {} exited during the check", key.pid, client.pid)),
    }
}

/// `pid`'s parent, or its parent's (claude runs `/bin/sh -c`, which runs hook-client), is `claude`.
fn descends(pid: i32, claude: ProcessKey) -> Result<(), String> {
    let mut at = pid;
    for _ in 0..3 {
        let stat = crate::os::read_stat(at).map_err(|e| format!("pid {at}: {e}"))?;
        if stat.ppid == claude.pid {
            return match claude.is_alive() && stat.starttime >= claude.starttime {
                true => Ok(()),
                false => Err(format!("pid {} is not the process that made the sockets", claude.pid)),
            };
        }
        at = stat.ppid;
    }
    Err(format!("the client pid {pid} does not descend from pid {} (within 3 parents)", claude.pid))
}

/// The inode of the Unix stream socket `fd` is, or why it is not one.
fn socket_inode(fd: &OwnedFd) -> Result<u64, String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    let kind = nix::sys::socket::getsockopt(fd, nix::sys::socket::sockopt::SockType);
    match (st.st_mode & libc::S_IFMT, kind) {
        (libc::S_IFSOCK, Ok(nix::sys::socket::SockType::Stream)) => Ok(st.st_ino),
        _ => Err(format!("a passed fd is not a stream socket (mode {:o})", st.st_mode)),
    }
}

/// The client closed its end (or wrote after its request): nothing to hold for.
fn closed(conn: &UnixStream) -> bool {
    let mut pfd = libc::pollfd { fd: conn.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd on a live fd, no wait.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready != 0
}

/// The request frame, then (asked for only now: a broker that never reads holds no copy of the
/// hook's stdout, which would keep claude from seeing it end) the fds, on one byte; all of it by
/// `until`.
fn read_request(conn: &mut UnixStream, until: Instant) -> std::io::Result<(WakeRequest, Vec<OwnedFd>)> {
    let req: WakeRequest = wire::read_json(&mut Until { conn, until }, wire::MAX_FRAME)?;
    wire::write_json(conn, &WakeReply { fds: true, ..WakeReply::default() })?;
    Until { conn, until }.time_left()?;
    let (n, fds) = recv_with_fds(conn, &mut [0u8; 1])?;
    match n {
        1 => Ok((req, fds)),
        _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
    }
}

/// A connection read under one deadline for the whole exchange: each read may wait only for
/// what is left of it.
struct Until<'a> {
    conn: &'a UnixStream,
    until: Instant,
}

impl Until<'_> {
    /// Sets the connection's read timeout to what is left; an error once nothing is.
    fn time_left(&self) -> std::io::Result<()> {
        match self.until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            Some(left) => self.conn.set_read_timeout(Some(left)),
            None => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's deadline passed")),
        }
    }
}

impl std::io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.time_left()?;
        std::io::Read::read(&mut &*self.conn, buf)
    }
}

/// A session's slot among the held wakes, freed when dropped (if no newer wake took it).
struct HeldSlot<'a> {
    held: &'a Mutex<HashMap<ThreadId, u64>>,
    session: ThreadId,
    number: u64,
}

impl<'a> HeldSlot<'a> {
    /// Takes the session's slot for wake `number` (the older wake of the session sees it is no
    /// longer the newest and ends); `None` when [`MAX_HELD`] other sessions hold one.
    fn take(held: &'a Mutex<HashMap<ThreadId, u64>>, session: &ThreadId, number: u64) -> Option<HeldSlot<'a>> {
        let mut map = held.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_HELD && !map.contains_key(session) {
            return None;
        }
        map.insert(session.clone(), number);
        Some(HeldSlot { held, session: session.clone(), number })
    }
}

impl Drop for HeldSlot<'_> {
    fn drop(&mut self) {
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.session) == Some(&self.number) {
            map.remove(&self.session);
        }
    }
}

/// `recvmsg` into `buf`, keeping the `SCM_RIGHTS` fds that came with it (close-on-exec).
fn recv_with_fds(conn: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    const MAX_FDS: usize = 4;
    // SAFETY: the msghdr points at live buffers for the call; the control buffer is u64-aligned
    // and CMSG_SPACE large; each fd the kernel installed is owned exactly once.
    unsafe {
        let space = libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<libc::c_int>()) as u32) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok((n as usize, fds))
    }
}

/// Whether `store`'s pin of the wake's session says its turn's last proven hook was its Stop.
fn pin_idle(store: &Store, p: &Proven) -> Result<bool> {
    let pin = store.claude_session_pin(&p.payload.session_id)?;
    Ok(pin.is_some_and(|pin| {
        pin.owner == p.key()
            && pin.prompt_id.as_deref() == Some(&p.payload.prompt_id)
            && pin.activity == Some(crate::store::SessionActivity::Idle)
    }))
}

/// Whether `store`'s pin of the wake's session names its claude and its turn.
fn pin_is(store: &Store, p: &Proven) -> Result<bool> {
    let pin = store.claude_session_pin(&p.payload.session_id)?;
    Ok(pin.is_some_and(|pin| pin.owner == p.key() && pin.prompt_id.as_deref() == Some(&p.payload.prompt_id)))
}
