//! What is known of a rollout's open turn, and what its records say Codex is doing in it.

use codex_format::rollout::Rec;

/// What is known about the open turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Turn {
    /// No turn is open (none was opened, or the last one closed).
    Closed,
    Open(String),
    /// The backward scan found neither a turn record nor a record inside a turn.
    Unknown,
}

/// What the open turn's records say Codex is doing: the state each hook follows
/// ("one ticket per Codex action"; bound to hooks in `gate/ticket.rs`). Reset when a turn opens or
/// closes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    /// Tool calls of the open turn with no output yet, oldest first.
    pub calls: Vec<OpenCall>,
    /// More calls were open at once than are kept ([`MAX_OPEN_CALLS`]): no call is known answered
    /// by all until the turn ends.
    pub overflow: bool,
    /// The model has produced output in the open turn (a response ended, a call, a message).
    pub spoke: bool,
    /// Where the newest model output after the turn's last tool call starts: the answer a Stop hook
    /// follows (`None` once a tool call follows it).
    pub said_at: Option<u64>,
}

/// A tool call of the open turn with no output yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCall {
    pub id: String,
    /// Its `item_completed` was written (the tool finished).
    pub completed: bool,
}

/// Open tool calls kept per turn at most.
pub const MAX_OPEN_CALLS: usize = 256;

impl Actions {
    pub(super) fn apply(&mut self, rec: &Rec, at: u64) {
        match rec {
            Rec::Usage(_) => self.spoke = true,
            Rec::Call { id, .. } => {
                self.spoke = true;
                self.said_at = None;
                if self.calls.iter().any(|c| &c.id == id) {
                } else if self.calls.len() < MAX_OPEN_CALLS {
                    self.calls.push(OpenCall { id: id.clone(), completed: false });
                } else {
                    self.overflow = true;
                }
            }
            Rec::Said(_) => {
                self.spoke = true;
                self.said_at = Some(at);
            }
            Rec::Output(id) => self.calls.retain(|c| &c.id != id),
            Rec::Completed(id) => {
                if let Some(c) = self.calls.iter_mut().find(|c| &c.id == id) {
                    c.completed = true;
                }
            }
            Rec::Started(_) | Rec::Closed(_) | Rec::Context(_) => {}
        }
    }
}
