//! A message row for other modules' unit tests.

use super::{Kind, Message, State};

impl Message {
    /// A message row for unit tests: `kind` and `state` as stored, every optional field empty.
    pub fn sample(id: &str, thread: &str, kind: &str, state: &str) -> Message {
        Message {
            id: id.into(),
            thread: thread.into(),
            kind: Kind::parse(kind).unwrap(),
            state: State::parse(state).unwrap(),
            body: String::new(),
            from: None,
            key: None,
            created_at: 0,
            updated_at: 0,
            expires_at: None,
            event: None,
            turn_id: None,
            lease: None,
            handed_at: None,
            confirmed_at: None,
            reason: None,
            attempts: 0,
            rollout_path: None,
            scan_offset: None,
            alarms: Vec::new(),
            shown_by: None,
            sender_check: None,
        }
    }
}
