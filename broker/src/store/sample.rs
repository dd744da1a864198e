//! A message row for other modules' unit tests.

use super::{Kind, Message, State};
use courier_shared::ids::ThreadId;

/// Thread ids for unit tests.
pub const T1: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");
pub const T2: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce3");

impl Message {
    /// A message row for unit tests: `kind` and `state` as stored, every optional field empty.
    pub fn sample(id: &str, thread: &ThreadId, kind: &str, state: &str) -> Message {
        Message {
            id: id.into(),
            thread: thread.clone(),
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
            mode: Default::default(),
        }
    }
}
