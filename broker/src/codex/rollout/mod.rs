//! Incremental reading of Codex rollouts for the verification gate (its steps 6 and 7: the
//! rollout's identity around the read, and its open turn).
//!
//! Rollouts can grow to gigabytes and every hook call needs two facts from one: the thread it
//! belongs to (`session_meta`, the first line) and the open turn (the last `task_started` not yet
//! closed by `task_complete`/`turn_aborted`). [`RolloutTracker`] keeps, per path and file identity
//! (device, inode, birth time), the byte offset read so far, the head and tail of any partial
//! trailing line, the `session_meta` and the open turn; each call reads only the bytes appended
//! since the last one.
//!
//! # First sight of a large rollout (a broker restart, a long `exec resume`)
//! It is not read whole: after the first line, the tail is read BACKWARDS, at most
//! [`MAX_BACKSCAN`] bytes, to the last turn record, which alone decides the open turn. A turn can
//! have been opened further back than that (one turn of many large tool outputs): the open turn
//! is then the turn named by the newest record Codex writes only *inside* its turn (a
//! `turn_context`, a `token_usage_record`, or model output, whose passthrough metadata carries
//! the turn id): no turn record after it means that turn has not closed, and no other turn has
//! opened. Such a record is written at every model response, so it is never far from the end
//! while a turn runs; if none is in the window either, the open turn stays unknown until the next
//! one is appended (forward reading adopts it the same way). No fixed window decides which turn
//! is open, and a call reads at most [`MAX_BACKSCAN`] bytes (plus two 4 KiB reads per line that
//! crosses a chunk boundary).
//!
//! When the identity changes (the file was replaced at the same path), the cached state is dropped
//! and rebuilt from the new file's own `session_meta`: nothing about the new file is trusted because
//! of its path.
//!
//! # Reading lines
//! Codex writes compact JSON, one record per line, its fields in a fixed order. Only the start of a
//! line (the record and payload types, turn ids, call ids) and its end (model output's passthrough
//! turn id) matter here, so at most [`HEAD_KEEP`] + [`TAIL_KEEP`] bytes of any line are kept, however
//! long it is; lines are classified by their member names as bytes (`"type"`, `"turn_id"`), which
//! text inside a JSON string can never produce (its quotes are escaped). Spaces after `:` and `,`
//! are allowed (Codex writes none; other writers, such as the tests' stand-ins, may).
//!
//! # Layout
//! This file: the cache of read states and what a call returns. `classify.rs`: line bytes to a
//! [`Rec`]. `turn.rs`: the open turn and its [`Actions`]. `state.rs`: one rollout's read state
//! (first line, forward, backwards). `crate::lines` (`broker/src/lines.rs`): positioned reads and line ends.

mod find;

mod state;
mod turn;

pub use find::{find_rollout, rollouts_newest_first, uuid_v7_ms};
pub use turn::{Actions, OpenCall, MAX_OPEN_CALLS};

use state::State;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which file a cached state belongs to. Size is deliberately absent: rollouts grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RolloutIdentity {
    pub dev: u64,
    pub ino: u64,
    pub btime_sec: i64,
    pub btime_nsec: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The thread id.
    pub id: String,
    /// The root thread id (equals `id` for a root thread).
    pub session_id: Option<String>,
    pub parent_thread_id: Option<String>,
}

/// What one [`RolloutTracker::update`] learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub identity: RolloutIdentity,
    /// `None` when the first line is missing, incomplete, or not a `session_meta` record.
    pub session_meta: Option<SessionMeta>,
    pub open_turn: Option<String>,
    /// End of the last complete line read: everything before it has been accounted for.
    pub offset: u64,
    /// Bytes read from the file by this call.
    pub bytes_read: u64,
    /// The cached state was (re)built from scratch by this call.
    pub rebuilt: bool,
    /// What the open turn's records say Codex is doing (empty when no turn is open).
    pub actions: Actions,
}
/// Bytes kept of the start of a line.
pub const HEAD_KEEP: usize = 4096;
/// Bytes kept of the end of a line.
pub const TAIL_KEEP: usize = 4096;
/// On first sight, more unread bytes than this after the first line are scanned backwards.
const BACKSCAN_THRESHOLD: u64 = 256 * 1024;
/// The backward scan reads at most this much of a rollout's tail.
pub const MAX_BACKSCAN: u64 = 16 << 20;
/// Cached rollouts kept before the cache is cleared.
const MAX_STATES: usize = 4096;

/// Per-rollout incremental read state, shared by all connection threads.
#[derive(Default)]
pub struct RolloutTracker {
    states: Mutex<HashMap<PathBuf, Arc<Mutex<State>>>>,
    /// Bytes read from rollouts over the tracker's life.
    pub total_bytes_read: AtomicU64,
}

impl RolloutTracker {
    pub fn new() -> RolloutTracker {
        RolloutTracker::default()
    }

    /// Brings the cached state of `path` up to date by reading `file` (an fd opened on that path,
    /// whose identity the caller captured as `identity` and whose length it saw as `len`).
    pub fn update(&self, path: &Path, file: &File, identity: RolloutIdentity, len: u64) -> io::Result<Snapshot> {
        let cell = {
            let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
            if states.len() >= MAX_STATES && !states.contains_key(path) {
                states.clear();
            }
            states.entry(path.to_path_buf()).or_insert_with(|| Arc::new(Mutex::new(State::new(identity)))).clone()
        };
        let mut state = cell.lock().unwrap_or_else(|p| p.into_inner());
        let mut rebuilt = false;
        // A different file at this path, or one that shrank: forget everything about the old one.
        if state.identity != identity || len < state.offset || !state.meta_done {
            *state = State::new(identity);
            rebuilt = true;
        }
        let result = (|| -> io::Result<u64> {
            let mut read = 0;
            if !state.meta_done {
                read += state.read_meta(file)?;
                if !state.meta_done {
                    return Ok(read);
                }
                if len > state.offset && len - state.offset > BACKSCAN_THRESHOLD {
                    read += state.scan_backwards(file, len)?;
                }
            }
            read += state.read_forward(file)?;
            Ok(read)
        })();
        let read = match result {
            Ok(r) => r,
            Err(e) => {
                // Half-applied state is not to be trusted next time.
                *state = State::new(identity);
                return Err(e);
            }
        };
        self.total_bytes_read.fetch_add(read, Ordering::Relaxed);
        Ok(Snapshot {
            identity,
            session_meta: state.meta.clone(),
            open_turn: state.open_turn(),
            offset: state.line_start,
            bytes_read: read,
            rebuilt,
            actions: state.actions.clone(),
        })
    }

    pub fn cached_paths(&self) -> usize {
        self.states.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests;
